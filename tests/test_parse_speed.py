"""Parse speed kept (issue 22 item 4): a quick side-by-side ratio with floors well below
`make bench`'s targets (75x prometheus_client, 6x a bare line count), so machine noise
never fails it but a regression like the one that went unnoticed does (22x and 17.9x then;
11x and 89x at the start of the next round, when a b"vllm:reque" prefix walked vLLM's
~2,000 request_* histogram lines in Python). Measured when the floors were set: 78-80x
and 4.5-4.7 line counts (thread CPU time, successive polls of the DP=8 dump)."""

from __future__ import annotations

import importlib.util

from conftest import REPO

FLOOR_SPEEDUP, CEILING_COST = 40.0, 12.0


def test_parse_and_derive_stay_far_faster_than_prometheus_client():
    spec = importlib.util.spec_from_file_location("bench_parse", REPO / "bench" / "bench_parse.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    speedup, cost = bench.ratios(rounds=100)
    assert speedup >= FLOOR_SPEEDUP, f"parse + derive only {speedup:.1f}x prometheus_client (floor {FLOOR_SPEEDUP:g}x)"
    assert cost <= CEILING_COST, f"parse + derive cost {cost:.1f}x a line count (ceiling {CEILING_COST:g}x)"
