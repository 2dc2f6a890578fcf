"""/metrics bodies are cached by what decides the bytes, not by the Content-Type a client
chooses: a client cycling `version=1.0.<n>` used to force one render per scrape and hold one
cached body per version (at 4,096 engines ~13 MB each, plus its gzip)."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from vllm_specdec_exporter.collector import Exposition


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
            identity, _ = await exposition.bodies(encoder, state)
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
