"""Fixtures shared by the tests: the vLLM payloads and seed records live in tests/fixtures (see its README)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

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
