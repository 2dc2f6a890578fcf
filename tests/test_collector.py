"""collector.py: /metrics rendered once per state (Exposition), cached by what decides the
bytes, and off the event loop at the documented bounds. Each section below keeps the
docstring of the file it came from (issue 32).
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time

import pytest
from http_fixtures import LoopbackServer, prom
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from serve_harness import get, polls_done, start_serve
from vllm_specdec_exporter.collector import Exposition

# ---- from test_exposition_cache.py
# /metrics bodies are cached by what decides the bytes, not by the Content-Type a client
# chooses: a client cycling `version=1.0.<n>` used to force one render per scrape and hold one
# cached body per version (at 4,096 engines ~13 MB each, plus its gzip).


class Counting:
    def __init__(self):
        self.collects = 0

    def collect(self):
        self.collects += 1
        g = GaugeMetricFamily("x_ratio", "one gauge", labels=["a"])
        g.add_metric(["b"], 0.5)
        yield g


def renders(accepts: list[str], states=None) -> tuple[int, list[bytes]]:
    registry, counting = CollectorRegistry(auto_describe=False), Counting()
    registry.register(counting)
    exposition = Exposition(registry)
    state = (object(),)

    async def go() -> list[bytes]:
        out = []
        for accept in accepts:
            encoder, _ = choose_encoder(accept)
            identity, _ = await exposition.bodies(encoder, lambda: state)
            out.append(identity)
        return out

    bodies = asyncio.run(go())
    return counting.collects, bodies


def test_openmetrics_versions_below_2_share_one_render():
    accepts = [f"application/openmetrics-text; version=1.0.{n}" for n in range(50)]
    collects, bodies = renders(accepts)
    assert collects == 1, collects
    assert len(set(bodies)) == 1 and bodies[0].endswith(b"# EOF\n")


def test_what_changes_the_bytes_still_renders_apart():
    accepts = ["", "application/openmetrics-text; version=1.0.0",
               "application/openmetrics-text; version=1.0.0; escaping=values",
               "application/openmetrics-text; version=2.0.0", "text/plain; version=0.0.4",
               "application/openmetrics-text; version=1.0.3", ""]
    collects, bodies = renders(accepts)
    # text 0.0.4 (and "" and text/plain 0.0.4: the same encoder), OpenMetrics, its other
    # escaping, OpenMetrics 2.0.0: four renders; the repeats are served from the cache.
    assert collects == 4, collects
    assert bodies[0] == bodies[4] == bodies[6] and bodies[1] == bodies[5]
    assert b"# EOF" not in bodies[0] and b"# EOF" in bodies[1]


def test_scrapes_waiting_on_a_render_begun_after_they_came_take_it():
    """30 scrapes at once, each with its own state (under a connection flood every scrape sees
    new connection counts): the first renders, the 29 that waited for it render once more
    between them (that render began after they came), not 29 times in a row."""
    registry, counting = CollectorRegistry(auto_describe=False), Counting()
    registry.register(counting)
    exposition = Exposition(registry)
    encoder, _ = choose_encoder("")

    async def go() -> list[bytes]:
        return [b for b, _ in await asyncio.gather(*(exposition.bodies(encoder, lambda n=n: (n,)) for n in range(30)))]

    bodies = asyncio.run(go())
    assert counting.collects == 2, counting.collects
    assert len(bodies) == 30 and all(b.startswith(b"# HELP x_ratio") for b in bodies)
    # One scrape later, with a state not seen: rendered again (the cache is by state, as before).
    asyncio.run(exposition.bodies(encoder, lambda: (99,)))
    assert counting.collects == 3


def test_a_scrape_that_waited_while_a_poll_published_keeps_the_newer_bodies():
    """A text render under way; an OpenMetrics scrape waits for it; a poll publishes; a text scrape
    waits too. Each renders once, at the newer state, and both bodies stay cached: one more scrape
    of each renders nothing. With the state read on arrival, the OpenMetrics body was labelled with
    the older state and dropped the text body of the newer one: two more renders."""
    registry, counting = CollectorRegistry(auto_describe=False), Counting()
    registry.register(counting)
    exposition = Exposition(registry)
    text, openmetrics = choose_encoder("")[0], choose_encoder("application/openmetrics-text; version=1.0.0")[0]
    current = [object()]

    def slow_text(reg):
        time.sleep(0.2)  # the render under way, in its thread
        return text(reg)

    async def go() -> None:
        first = asyncio.create_task(exposition.bodies(slow_text, lambda: (current[0],)))
        await asyncio.sleep(0.05)
        waiting_openmetrics = asyncio.create_task(exposition.bodies(openmetrics, lambda: (current[0],)))
        await asyncio.sleep(0.01)
        current[0] = object()  # a poll publishes a new view
        waiting_text = asyncio.create_task(exposition.bodies(text, lambda: (current[0],)))
        await asyncio.gather(first, waiting_openmetrics, waiting_text)
        rendered = counting.collects
        for encoder in (openmetrics, text):
            await exposition.bodies(encoder, lambda: (current[0],))
        assert counting.collects == rendered, (rendered, counting.collects)

    asyncio.run(go())
    assert counting.collects == 3  # the first text render, then OpenMetrics and text at the new state


def test_scrapes_in_two_formats_while_each_render_sees_a_poll_render_each_format_once_more():
    """A text render under way, then 20 scrapes alternating OpenMetrics and text, and a poll
    publishing during every render: each format renders once more and the rest take those
    (3 renders). Dropping the other format's body of the older state at each render, though
    scrapes still waiting could take it, rendered once per scrape (21; helper-37)."""
    current = [object()]

    class Publishing(Counting):
        def collect(self):
            time.sleep(0.02)  # a render under way, in its thread
            current[0] = object()  # a poll publishes meanwhile
            yield from super().collect()

    registry, counting = CollectorRegistry(auto_describe=False), Publishing()
    registry.register(counting)
    exposition = Exposition(registry)
    text, openmetrics = choose_encoder("")[0], choose_encoder("application/openmetrics-text; version=1.0.0")[0]

    async def go() -> list[bytes]:
        first = asyncio.create_task(exposition.bodies(text, lambda: (current[0],)))
        await asyncio.sleep(0.005)
        rest = [exposition.bodies((openmetrics, text)[n % 2], lambda: (current[0],)) for n in range(20)]
        return [b for b, _ in await asyncio.gather(first, *rest)]

    bodies = asyncio.run(go())
    assert counting.collects == 3, counting.collects
    assert all(b.endswith(b"# EOF\n") for b in bodies[1::2]) and not any(b"# EOF" in b for b in bodies[2::2])


# ---- from test_bounded_render.py
# Issue 19 item 8: at the documented bounds (4,096 engines held: examples/config.yaml's
# max_series_per_target), rendering /metrics must not stop the event loop: /healthz keeps
# answering while /metrics is scraped in a loop and every poll brings a new state to
# render. The real `serve` process; the precise figures are in bench/bench_sidecar.py.


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
