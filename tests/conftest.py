"""Fixtures shared by the tests: the vLLM payloads and seed records live in tests/fixtures (see its README)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# `make fuzz` runs the property tests under the "fuzz" profile: 100x the examples.
settings.register_profile("default", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("fuzz", max_examples=20_000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
PAYLOADS = FIXTURES / "payloads"
SEED_RECORDS = FIXTURES / "seed_records.json"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(condition: bool, what: str) -> None:
    """Skip locally when a tool or data set is missing; in CI that is a failure."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"{what} is missing, and CI=true forbids skipping")
    pytest.skip(f"{what} is missing")


@pytest.fixture(scope="session")
def payloads() -> dict[str, bytes]:
    found = {p.name: p.read_bytes() for p in sorted(PAYLOADS.glob("*.prom"))}
    assert len(found) == 3, f"expected the three vLLM payloads in {PAYLOADS}, found {sorted(found)}"
    return found


def cli_path() -> str:
    """The installed console script (what users run), next to this interpreter."""
    script = Path(sys.executable).parent / "vllm-specdec-exporter"
    return str(script) if script.exists() else shutil.which("vllm-specdec-exporter") or ""


def run_cli(*args: str, stdin: bytes | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    exe = cli_path()
    assert exe, "the vllm-specdec-exporter console script is not installed (pip install -e .)"
    return subprocess.run([exe, *args], input=stdin, capture_output=True, timeout=timeout)


# --- The one Prometheus stack of the end-to-end tests ---
# Its scenario takes about a minute of wall time (healthy, then a collapse that must
# page), so it is started once, right after collection, and the tests that read it
# run last: that minute passes while the rest of the suite runs.
_E2E = "collapse_stack"
_shared = ExitStack()
_started: list = []


# The promtool unit suites take ~40 s of CPU each: they too start right after
# collection, niced so that the latency tests keep their CPU, and are read last.
_PROMTOOL = "promtool_suites"
PROMTOOL_SUITES = ("sidecar.yaml", "vllm-direct.yaml")
_suites: dict[str, tuple[subprocess.Popen[bytes], Any]] = {}


def _start_promtool_suites() -> None:
    promtool = shutil.which("promtool")
    if promtool is None or _suites:
        return  # the fixture reports a missing promtool (a skip, or a failure in CI)
    for suite in PROMTOOL_SUITES:
        out = _shared.enter_context(tempfile.TemporaryFile())  # noqa: SIM115 -- closed at session end
        proc = subprocess.Popen(["nice", "-n", "19", promtool, "test", "rules", suite], cwd=REPO / "alerts" / "tests",
                                stdout=out, stderr=subprocess.STDOUT)
        _shared.callback(proc.kill)
        _suites[suite] = (proc, out)


@pytest.fixture(scope="session")
def promtool_suites() -> dict[str, tuple[int, str]]:
    """Each promtool unit suite's exit status and output (started after collection)."""
    require(shutil.which("promtool") is not None, "promtool (make tools installs Debian's prometheus)")
    _start_promtool_suites()
    results = {}
    for suite, (proc, out) in _suites.items():
        proc.wait(timeout=600)
        out.seek(0)
        results[suite] = (proc.returncode, out.read().decode(errors="replace"))
    return results


@pytest.hookimpl(trylast=True)  # after -k / -m deselection
def pytest_collection_modifyitems(config, items):
    if config.option.collectonly:
        return
    late = [item for item in items if {_E2E, _PROMTOOL} & set(getattr(item, "fixturenames", ()))]
    if any(_PROMTOOL in item.fixturenames for item in late):
        _start_promtool_suites()
    e2e = [item for item in late if _E2E in item.fixturenames]
    items[:] = [item for item in items if item not in set(late)] + late
    if e2e and shutil.which("prometheus"):  # if not, the fixture says so (a skip, or a failure in CI)
        from prom_harness import collapse_stack as start

        with contextlib.suppress(Exception):  # the fixture starts it again, inside a test, and reports why
            _started.append(_shared.enter_context(start()))



@pytest.fixture(scope="session")
def collapse_stack():
    if not _started:
        from prom_harness import collapse_stack as start

        _started.append(_shared.enter_context(start()))
    return _started[0]


def pytest_sessionfinish(session, exitstatus):
    _shared.close()
