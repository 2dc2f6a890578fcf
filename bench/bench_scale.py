"""Scale (`make bench`): cost per poll against engines, k and payload size (with a
fitted slope), the exporter's own /metrics at 64 engines x k=8 x 4 windows, and a
naive exporter built on prometheus_client's parser, side by side in one run.
Prints `name: value` lines."""

from __future__ import annotations

import statistics
import sys
import time

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from vllm_specdec_exporter import config as c
from vllm_specdec_exporter.adapters import extract
from vllm_specdec_exporter.collector import SpecDecodeCollector
from vllm_specdec_exporter.history import TargetHistory
from vllm_specdec_exporter.scenarios import parse_scenario
from vllm_specdec_exporter.settings import build_settings
from vllm_specdec_exporter.simulate import Simulation
from vllm_specdec_exporter.views import TargetView, history_windows, model_views

SETTINGS = build_settings({}, {"urls": ["http://127.0.0.1:1/metrics"]})


def payload(engines: int, k: int, t: float = 60.0) -> bytes:
    per_position = [round(0.9 ** (i + 1), 4) for i in range(k)]
    sim = Simulation(
        parse_scenario(
            {
                "model_name": "deepseek-ai/DeepSeek-V4-Pro",
                "engines": engines,
                "k": k,
                "drafts_per_second": 40,
                "per_position": per_position,
            },
            "bench",
        ),
        clock=lambda: 0.0,
    )
    sim.advance_to(t)
    return sim.render()


def poll_work(history: TargetHistory, data: bytes, t: float) -> None:
    """What one poll costs once the bytes have arrived: parse, fold into windows, derive."""
    snap = extract(data, c.DEFAULT_MAX_PAYLOAD_BYTES)
    history.observe(t, snap.engines)
    model_views(history_windows(history, SETTINGS), snap.engines, SETTINGS, None)


def median_poll_seconds(data: bytes, rounds: int) -> float:
    history = TargetHistory(SETTINGS.windows, 7200)
    samples = []
    for i in range(rounds):
        start = time.perf_counter()
        poll_work(history, data, float(i))
        samples.append(time.perf_counter() - start)
    return statistics.median(samples[1:])


def fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least squares y = a + b x; returns slope, intercept and R^2."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    a = my - b * mx
    ss_res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys, strict=True))
    ss_tot = sum((y - my) ** 2 for y in ys)
    return b, a, 1 - ss_res / ss_tot


def naive_poll(data: bytes) -> float:
    """What a user writes by hand: parse everything, sum the counters, divide."""
    drafts = accepted = 0.0
    for family in text_string_to_metric_families(data.decode()):
        for s in family.samples:
            if s.name == "vllm:spec_decode_num_drafts_total":
                drafts += s.value
            elif s.name == "vllm:spec_decode_num_accepted_tokens_total":
                accepted += s.value
    return 1 + accepted / drafts


def main() -> int:
    # --- engines and k ---
    engine_points, engine_costs = [], []
    for engines in (1, 8, 64):
        for k in (1, 2, 4, 8):
            data = payload(engines, k)
            cost = median_poll_seconds(data, 30 if engines < 64 else 10)
            print(f"poll_seconds_e{engines}_k{k}: {cost:.6f}  (payload_bytes: {len(data)})")
            if k == 2:
                engine_points.append(engines)
                engine_costs.append(cost)
    slope, _intercept, r2 = fit(engine_points, engine_costs)

    print(f"poll_cost_slope_seconds_per_engine_k2: {slope:.7f}")
    print(f"poll_cost_vs_engines_r2: {r2:.4f}")

    # --- payload size up to 10 MB (8 engines, k=2, padded with other families) ---
    base = payload(8, 2)
    filler = b"".join(
        f'vllm:request_latency_seconds_bucket{{engine="0",le="{i}.0",model_name="m"}} {i}.0\n'.encode() for i in range(2000)
    )
    sizes, costs = [], []
    for target_mb in (0.5, 1, 2, 5, 10):
        data = base
        while len(data) < target_mb * 1024 * 1024:
            data += filler
        cost = median_poll_seconds(data, 15)
        sizes.append(len(data) / 1e6)
        costs.append(cost)
        print(f"poll_seconds_{target_mb:g}mb: {cost:.6f}")
    slope, _intercept, r2 = fit(sizes, costs)

    print(f"poll_cost_slope_seconds_per_mb: {slope:.6f}")
    print(f"poll_cost_vs_payload_r2: {r2:.4f}")

    # --- the exporter's own /metrics at 64 engines x k=8 x 4 windows ---
    history = TargetHistory(SETTINGS.windows, 7200)
    snap = None
    for i, t in enumerate((60.0, 120.0)):
        snap = extract(payload(64, 8, t))
        history.observe(float(i * 60), snap.engines)
    view = TargetView(
        "vllm",
        "http://127.0.0.1:1/metrics",
        up=True,
        last_success_mono=0.0,
        raw=snap.engines,
        models=model_views(history_windows(history, SETTINGS), snap.engines, SETTINGS, None),
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SpecDecodeCollector(lambda: [view], SETTINGS, lambda: 0.0))
    renders = []
    for _ in range(20):
        start = time.perf_counter()
        body = generate_latest(registry)
        renders.append(time.perf_counter() - start)
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    print(f"exporter_metrics_bytes_e64_k8_w4: {len(body)}")
    print(f"exporter_metrics_series_e64_k8_w4: {series}")
    print(f"exporter_metrics_render_seconds_e64_k8_w4: {statistics.median(renders):.5f}")

    # --- side by side with a naive exporter on prometheus_client's parser ---
    data = payload(8, 2)
    history = TargetHistory(SETTINGS.windows, 7200)
    rounds = 30
    start = time.process_time()
    for _ in range(rounds):
        naive_poll(data)
    naive = (time.process_time() - start) / rounds
    start = time.process_time()
    for i in range(rounds):
        poll_work(history, data, float(i))
    ours = (time.process_time() - start) / rounds
    print(f"naive_exporter_cpu_seconds_per_poll: {naive:.5f}")
    print(f"our_cpu_seconds_per_poll: {ours:.5f}")
    print(f"naive_vs_ours_cpu_ratio: {naive / ours:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
