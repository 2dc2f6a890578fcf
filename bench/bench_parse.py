"""Parse + derive cost, measured side by side in one run (`make bench`).

Prints one `name: value` line per figure. Ratios, not absolute times, are the
targets, because these machines are shared and noisy: every contender is timed
in the same process, interleaved, taking the median of many rounds, on the thread's
CPU time (time.thread_time), so time spent waiting for a busy core counts for none.

What is measured is what the exporter does with each payload it reads: the
parse, the adapter, the derived figures and the verdict (summary.summarize, as
`report` and /api/v1/summary; the sidecar's poll derives per window instead).
Like real consecutive polls, the payloads timed one after the other differ in
their values (counters advance, so every value is read again), while the
families, label sets and layout stay: nothing may be reused from one payload to
the next but what a real server keeps between polls.
"""

from __future__ import annotations

import re
import statistics
import sys
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString
from vllm_specdec_exporter.adapters import extract
from vllm_specdec_exporter.parser import SeriesCache
from vllm_specdec_exporter.summary import summarize

REPO = Path(__file__).resolve().parent.parent
DP8 = REPO / "examples" / "vllm-v1-dp8-k2.prom"


# One target's series cache, kept from poll to poll as the sidecar keeps it (parse_pool).
CACHE = SeriesCache()


def ours(data: bytes) -> dict:
    return summarize(extract(data, cache=CACHE).engines)


def timed(fn, payloads: list[bytes], rounds: int) -> float:
    """Median seconds of fn over ``rounds`` calls, each on the next payload (a poll after another),
    freshly copied as a poll's body is freshly read (so in the cache as much as it would be)."""
    samples = []
    clock = time.thread_time
    for i in range(rounds):
        data = bytes(memoryview(payloads[i % len(payloads)]))
        start = clock()
        fn(data)
        samples.append(clock() - start)
    return statistics.median(samples)


_VALUE = re.compile(rb"^([a-zA-Z_:][^\n]* )([0-9][0-9.e+\-]*)$", re.MULTILINE)


def polls(data: bytes, count: int) -> list[bytes]:
    """``count`` successive polls of the payload: poll i has every sample's value times i + 1
    (whole numbers stay whole, so the counters keep their invariants exactly), written as
    prometheus_client writes them: their lengths change, so the families move in the payload
    as on a real server."""

    def advance(i: int) -> bytes:
        return _VALUE.sub(lambda m: m.group(1) + floatToGoString(float(m.group(2)) * (i + 1)).encode(), data)

    return [advance(i) for i in range(count)]


def line_pass(data: bytes) -> int:
    return data.count(b"\n")


def prometheus_client_parse(data: bytes) -> int:
    return sum(len(f.samples) for f in text_string_to_metric_families(data.decode()))


def synthetic_payload(engines: int, k: int, filler_lines_per_engine: int = 400) -> bytes:
    """A vLLM-shaped payload: histogram-like filler per engine plus the spec-decode families."""
    model = "deepseek-ai/DeepSeek-V4-Pro"
    out = []
    for e in range(engines):
        for i in range(filler_lines_per_engine):
            out.append(f'vllm:request_latency_seconds_bucket{{engine="{e}",le="{i}.0",model_name="{model}"}} {i * 7}.0')
    for fam, mult in (("num_drafts", 100), ("num_draft_tokens", 100 * k), ("num_accepted_tokens", 60 * k)):
        out.append(f"# TYPE vllm:spec_decode_{fam}_total counter")
        out += [f'vllm:spec_decode_{fam}_total{{engine="{e}",model_name="{model}"}} {mult * (e + 1)}.0' for e in range(engines)]
    out.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter")
    for e in range(engines):
        for p in range(k):
            out.append(
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="{e}",model_name="{model}",position="{p}"}} '
                f"{60 * k * (e + 1) // k}.0"
            )
    return ("\n".join(out) + "\n").encode()


# Issue 22's targets (the cost also for the 64-engine k=8 payload); make test checks floors
# well below them (tests/test_parser.py) so that noise never fails it but a regression does.
TARGET_SPEEDUP, TARGET_COST = 75.0, 6.0
POLLS = 8  # distinct successive payloads cycled through


def ratios(rounds: int = 400, payloads: list[bytes] | None = None) -> tuple[float, float]:
    """(speedup vs prometheus_client, cost vs a bare line count) on the DP=8 dump's polls,
    each pair timed side by side, interleaved in rounds of 20 so a burst of load hits both."""
    payloads = payloads or polls(DP8.read_bytes(), POLLS)
    mine, base, ref = [], [], []
    for r in range(max(rounds // 20, 1)):
        base.append(timed(line_pass, payloads, 20))
        mine.append(timed(ours, payloads, 20))
        ref.append(timed(prometheus_client_parse, payloads[r % len(payloads) :], 1))
    m = statistics.median(mine)
    return statistics.median(ref) / m, m / statistics.median(base)


def cost(payloads: list[bytes], rounds: int = 10) -> tuple[float, float]:
    """(parse + derive seconds, its cost vs a bare line count), interleaved as ratios()."""
    mine, base = [], []
    for _ in range(rounds):
        base.append(timed(line_pass, payloads, 10))
        mine.append(timed(ours, payloads, 10))
    m = statistics.median(mine)
    return m, m / statistics.median(base)


def main() -> int:
    data = DP8.read_bytes()
    payloads = polls(data, POLLS)
    assert all(ours(p)["models"] for p in payloads), "the benchmark payloads must hold spec-decode families"
    base = timed(line_pass, payloads, 400)
    mine = timed(ours, payloads, 400)
    ref = timed(prometheus_client_parse, payloads, 15)
    print(f"payload_bytes: {len(data)}")
    print(f"payload_lines: {line_pass(data)}")
    print(f"line_pass_seconds: {base:.6f}")
    print(f"parse_derive_seconds: {mine:.6f}")
    print(f"prometheus_client_parse_seconds: {ref:.6f}")
    print(f"parse_speedup_vs_prometheus_client: {ref / mine:.1f}")
    print(f"parse_cost_vs_line_count: {mine / base:.2f}")

    big = polls(synthetic_payload(64, 8), 4)
    assert all(ours(p)["models"]["deepseek-ai/DeepSeek-V4-Pro"]["all"]["k"] == 8 for p in big)
    big_mine, big_cost = cost(big)
    print(f"e64_k8_payload_bytes: {len(big[0])}")
    print(f"e64_k8_parse_derive_seconds: {big_mine:.6f}")
    print(f"e64_k8_parse_cost_vs_line_count: {big_cost:.2f}")

    speedup, dp8_cost = ratios(payloads=payloads)
    print(f"interleaved_speedup_vs_prometheus_client: {speedup:.1f}")
    print(f"interleaved_cost_vs_line_count: {dp8_cost:.2f}")
    ok = speedup >= TARGET_SPEEDUP and dp8_cost <= TARGET_COST and big_cost <= TARGET_COST
    print(
        f"targets_met: {int(ok)}  (speedup >= {TARGET_SPEEDUP:g}, cost vs line pass <= {TARGET_COST:g} "
        "on the DP=8 dump and the 64-engine k=8 payload)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
