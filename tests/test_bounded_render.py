"""Issue 19 item 8: at the documented bounds (4,096 engines held: examples/config.yaml's
max_series_per_target), rendering /metrics must not stop the event loop: /healthz keeps
answering while /metrics is scraped in a loop and every poll brings a new state to
render. The real `serve` process; the precise figures are in bench/bench_sidecar.py."""

from __future__ import annotations

import tempfile
import threading
import time

import pytest
from http_fixtures import LoopbackServer, prom
from serve_harness import get, polls_done, start_serve

ENGINES = 4096
K = 8
V1 = "vllm:spec_decode_num_"


def engines_payload(n: int, engines: int = ENGINES, k: int = K) -> bytes:
    """``engines`` healthy engines, their counters grown by poll number ``n``."""
    d = 100_000 * (n + 1)
    out = []
    for e in range(engines):
        lab = f'engine="{e}",model_name="deepseek-ai/DeepSeek-V4-Pro"'
        per_position = [int(0.8 ** (i + 1) * d) for i in range(k)]
        out.append(f"{V1}drafts_total{{{lab}}} {d}\n{V1}draft_tokens_total{{{lab}}} {k * d}\n"
                   f"{V1}accepted_tokens_total{{{lab}}} {sum(per_position)}\n")
        out += [f'{V1}accepted_tokens_per_pos_total{{{lab},position="{i}"}} {n}\n' for i, n in enumerate(per_position)]
    return "".join(out).encode()


@pytest.mark.xdist_group("latency")  # timing assertions: never beside another latency test
def test_healthz_answers_while_metrics_of_4096_engines_is_rendered_on_every_poll():
    bodies = [engines_payload(n) for n in range(2)]
    with LoopbackServer(lambda n: prom(bodies[n % 2] if n < 2 else engines_payload(n))) as vllm, \
            tempfile.NamedTemporaryFile("w", suffix=".yaml") as cfg:
        cfg.write(f"targets: [{{url: '{vllm.url}'}}]\nmax_series_per_target: {ENGINES}\nmin_drafts: 1\n")
        cfg.flush()
        proc, port = start_serve("--config.file", cfg.name, "--poll.interval", "2s")
        try:
            deadline = time.monotonic() + 120
            while polls_done(port) < 2 and time.monotonic() < deadline:
                time.sleep(0.5)
            assert polls_done(port) >= 2, "no two successful polls"
            stop, sizes = threading.Event(), []

            def scrape() -> None:
                while not stop.is_set():
                    sizes.append(len(get(port, "/metrics", timeout=60)[1]))
            scraper = threading.Thread(target=scrape)
            scraper.start()
            latencies = []
            try:
                end = time.monotonic() + 20
                while time.monotonic() < end:
                    started = time.monotonic()
                    status, _ = get(port, "/healthz")
                    latencies.append(time.monotonic() - started)
                    assert status == 200
                    time.sleep(0.02)
            finally:
                stop.set()
                scraper.join(60)
            latencies.sort()
            p99 = latencies[int(0.99 * (len(latencies) - 1))]
            print(f"/healthz beside /metrics of {ENGINES} engines (k={K}, {max(sizes) / 1e6:.1f} MB, {len(sizes)} "
                  f"scrapes): {len(latencies)} requests, p99 {p99 * 1000:.0f} ms, worst {latencies[-1] * 1000:.0f} ms")
            assert len(sizes) >= 2 and min(sizes) > 1_000_000  # real scrapes of the whole exposition
            # 198 ms measured after, 1,145 ms before; 0.8 s leaves room for a loaded machine
            # (0.52 s seen at load 8 with two other test workers and vLLM training beside it).
            assert p99 < 0.8, latencies[-20:]
        finally:
            proc.kill()
            proc.wait()
