"""Fixtures shared by the tests: the vLLM payloads and seed records live in tests/fixtures (see its README)."""

from __future__ import annotations

import json
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


def cli_json(*args: str, timeout: float = 300) -> dict:
    """The command line's JSON output. The real-vLLM checks' deadline guards against a hang, not
    a slow run: a `diff` of two dumps takes about a second, and a stalled minute of a 2-core CI
    machine beside a vLLM once ran it past the 60 s deadline they had (a landing failed on it)."""
    res = run_cli(*args, "--format", "json", timeout=timeout)
    assert res.returncode == 0, res.stderr.decode()
    return json.loads(res.stdout)


# --- Background jobs: started once, right after collection, read by tests that run last ---
# The promtool unit suites (~45 s of CPU each, niced so the latency tests keep their CPU)
# and the one Prometheus stack of the end-to-end tests (a minute of wall time: healthy, then
# a collapse that must page) run while the rest of the suite does.
# Under pytest-xdist the controller owns them, since a worker may end while the other still
# reads them: a worker that collects their readers asks through a file in a shared folder,
# the controller starts them and writes their results (or why they failed) beside it.
_E2E = "collapse_stack"
_PROMTOOL = "promtool_suites"
PROMTOOL_SUITES = ("sidecar.yaml", "vllm-direct.yaml")
_SHARED_ENV = "VLLM_SPECDEC_TEST_SHARED"
_WORKER = "PYTEST_XDIST_WORKER" in os.environ
_shared = ExitStack()
_started: list = []
_starting: list = []  # the controller's thread that starts the stack, joined before the session closes
_suites: dict[str, tuple[subprocess.Popen[bytes], Any]] = {}


def _publish(path: Path, text: str) -> None:
    """Write then rename, so a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")  # its own: sidecar.yaml.rc and .out must not share one
    tmp.write_text(text)
    tmp.replace(path)


def _await_file(*paths: Path, timeout: float, what: str) -> Path:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in paths:
            if path.exists():
                return path
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")


def _start_promtool_suites(publish_to: Path | None = None) -> None:
    promtool = shutil.which("promtool")
    if promtool is None or _suites:
        return  # the fixture reports a missing promtool (a skip, or a failure in CI)
    # GOGC=400: a quarter less CPU for promtool's garbage collector, for ~160 MB of memory
    env = {**os.environ, "GOGC": "400"}
    for suite in PROMTOOL_SUITES:
        out = _shared.enter_context(tempfile.TemporaryFile())  # noqa: SIM115 -- closed at session end
        # Not niced: beside two CPU hogs a nice-19 promtool got a few % of a core and ran past
        # the tests' 600 s (issue 32 item 6: no niced subprocess a test depends on).
        proc = subprocess.Popen([promtool, "test", "rules", suite], cwd=REPO / "alerts" / "tests",
                                stdout=out, stderr=subprocess.STDOUT, env=env)
        _shared.callback(proc.kill)
        _suites[suite] = (proc, out)
    if publish_to is not None:
        import threading

        def publish() -> None:
            try:
                results = _promtool_results()
            except BaseException as e:  # never lost in the thread: the waiting tests fail with it
                results = {suite: (-1, f"the promtool suites were not read: {type(e).__name__}: {e}") for suite in _suites}
            for suite, result in results.items():
                _publish(publish_to / f"{suite}.out", result[1])
                _publish(publish_to / f"{suite}.rc", str(result[0]))

        threading.Thread(target=publish, daemon=True).start()


def _promtool_results() -> dict[str, tuple[int, str]]:
    results = {}
    for suite, (proc, out) in _suites.items():
        # On a busy machine it can take long: the waiting tests' own bound (_await_file) is the same.
        proc.wait(timeout=1800)
        out.seek(0)
        results[suite] = (proc.returncode, out.read().decode(errors="replace"))
    return results


@pytest.fixture(scope="session")
def promtool_suites() -> dict[str, tuple[int, str]]:
    """Each promtool unit suite's exit status and output (started after collection)."""
    require(shutil.which("promtool") is not None, "promtool (make tools installs Debian's prometheus)")
    if not _WORKER:
        _start_promtool_suites()
        return _promtool_results()
    shared = Path(os.environ[_SHARED_ENV])
    results = {}
    for suite in PROMTOOL_SUITES:
        _await_file(shared / f"{suite}.rc", timeout=1800, what=f"promtool test rules {suite}")
        results[suite] = (int((shared / f"{suite}.rc").read_text()), (shared / f"{suite}.out").read_text())
    return results


def _start_collapse_stack(publish_to: Path | None = None) -> None:
    from prom_harness import collapse_stack as start

    try:
        _started.append(_shared.enter_context(start()))
    except Exception as e:  # the fixture reports it (it starts the stack again, outside xdist)
        if publish_to is not None:
            _publish(publish_to / "stack.error", f"{type(e).__name__}: {e}")
        return
    if publish_to is not None:
        st = _started[0]
        _publish(publish_to / "stack.json", json.dumps(
            {"prom": st.prom.base, "started": st.started, "simulator_url": st.simulator_url,
             "exporter_url": st.exporter_url, "direct_prom": st.direct_prom.base if st.direct_prom else None}))


@pytest.fixture(scope="session")
def collapse_stack():
    if _WORKER:
        from prom_harness import Prom, Stack, tool

        tool("prometheus")  # missing: a skip, or a failure in CI
        shared = Path(os.environ[_SHARED_ENV])
        found = _await_file(shared / "stack.json", shared / "stack.error", timeout=120, what="the e2e stack")
        if found.name == "stack.error":
            pytest.fail(f"the e2e stack did not start: {found.read_text()}")
        st = json.loads(found.read_text())
        return Stack(Prom(st["prom"].removeprefix("http://")), st["started"], st["simulator_url"],
                     st["exporter_url"], Prom(st["direct_prom"].removeprefix("http://")) if st["direct_prom"] else None)
    if not _started:
        from prom_harness import collapse_stack as start

        _started.append(_shared.enter_context(start()))
    return _started[0]


def pytest_configure(config):
    # pytest-xdist registers it; without the plugin (-p no:xdist) --strict-markers would refuse the files using it
    config.addinivalue_line("markers", "xdist_group(name): tests pytest-xdist runs on one worker (make test)")
    if not _WORKER and _SHARED_ENV not in os.environ:  # inherited by the xdist workers
        os.environ[_SHARED_ENV] = _shared.enter_context(tempfile.TemporaryDirectory(prefix="specdec-tests-"))


@pytest.hookimpl(trylast=True)  # after -k / -m deselection
def pytest_collection_modifyitems(config, items):
    if config.option.collectonly:
        return
    late = [item for item in items if {_E2E, _PROMTOOL} & set(getattr(item, "fixturenames", ()))]
    rest = [item for item in items if item not in set(late)]
    # long tests first: two workers that end together rather than one left with a long test
    items[:] = sorted(rest, key=lambda item: item.get_closest_marker("long") is None) + late
    wants = {name for name in (_PROMTOOL, _E2E) if any(name in item.fixturenames for item in late)}
    if _WORKER:  # the controller starts them (pytest_xdist_node_collection_finished)
        for name in wants:
            (Path(os.environ[_SHARED_ENV]) / f"want-{name}").touch()
        return
    if _PROMTOOL in wants:
        _start_promtool_suites()
    if _E2E in wants and shutil.which("prometheus"):  # if not, the fixture says so (a skip, or a failure in CI)
        _start_collapse_stack()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """In the xdist controller, once a worker has collected: start what its tests asked for."""
    shared = Path(os.environ[_SHARED_ENV])
    if (shared / f"want-{_PROMTOOL}").exists():
        _start_promtool_suites(publish_to=shared)
    # without prometheus the fixture says so before it waits (a skip, or a failure in CI)
    if (shared / f"want-{_E2E}").exists() and not _starting and shutil.which("prometheus"):
        import threading  # it waits for Prometheus to be ready: not in the controller's loop

        _starting.append(threading.Thread(target=_start_collapse_stack, kwargs={"publish_to": shared}, daemon=True))
        _starting[-1].start()


def pytest_sessionfinish(session, exitstatus):
    try:
        for thread in _starting:  # a run that ends early (-x, ^C) would leave a half-started stack running
            thread.join(timeout=120)
    finally:
        _shared.close()
