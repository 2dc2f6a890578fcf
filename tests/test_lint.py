"""ruff over the repository (lint, import order; formatting of the package and bench) and
mypy --strict over the package: lint findings, unformatted code and type errors fail the
build (rule sets and strictness are configured in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import REPO

BIN = Path(sys.executable).parent


def _run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    exe = BIN / tool
    assert exe.exists(), f"{tool} is pinned in the test extra (pip install -e '.[test]')"
    return subprocess.run([str(exe), *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_ruff_finds_no_mistakes():
    # The whole repository; .e2e/, .venv/ and .tools/ are excluded in pyproject.toml.
    proc = _run("ruff", "check", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_package_and_bench_are_formatted():
    # ruff format (line length from pyproject.toml) over the package and the benchmarks.
    proc = _run("ruff", "format", "--check", "exporter", "bench")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_package_type_checks_strictly():
    # Files and strictness from [tool.mypy]; no cache, so a stale one cannot hide an error.
    proc = _run("mypy", "--no-incremental")
    assert proc.returncode == 0, proc.stdout + proc.stderr
