"""`diff` prints the same bytes whatever the interpreter's hash seed: engines only in BEFORE
were listed in set order, which changed from run to run."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from conftest import cli_path, require

DP8 = Path(__file__).parent / "fixtures" / "payloads" / "vllm-v1-dp8-k2-single-process.prom"


def test_engines_only_in_before_are_listed_in_the_dumps_order_under_any_hash_seed(tmp_path):
    require(bool(cli_path()), "the vllm-specdec-exporter console script")
    text = DP8.read_text()
    gone = re.compile(r'engine="[1-7]"')
    after = tmp_path / "after.prom"
    after.write_text("".join(line for line in text.splitlines(keepends=True) if not gone.search(line)))
    outs = set()
    for seed in ("1", "2", "3", "4"):
        run = subprocess.run([cli_path(), "diff", str(DP8), str(after)], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONHASHSEED": seed})
        outs.add(run.stdout + run.stderr)
    assert len(outs) == 1, outs
    listed = re.findall(r'engine="(\d)"[^\n]*in the first scrape only', outs.pop())
    assert listed == sorted(listed) and len(listed) >= 7, listed
