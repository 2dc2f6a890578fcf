"""ruff over the code: undefined or unused names and the like fail the build."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import REPO


def test_ruff_finds_no_mistakes():
    ruff = Path(sys.executable).parent / "ruff"
    assert ruff.exists(), "ruff is pinned in the test extra (pip install -e '.[test]')"
    proc = subprocess.run([str(ruff), "check", "exporter", "tests", "bench", "dashboards"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
