"""The sidecar's /metrics for a fixed input, kept as a golden file (as node_exporter keeps
its fixtures' output): any change to what is exported -- a name, a label, a help text, a
figure, the order -- shows as a diff here, and is either a bug or a deliberate change made
with UPDATE_GOLDEN=1 (then reviewed in the commit's diff).

The input is examples/broken-v4-pro-mtp: before.prom at the first poll, after.prom a minute
later, on a fake clock. Lines that measure this process or this run (durations, the clock,
process and Python figures, the build) are left out of the comparison."""

from __future__ import annotations

import asyncio
import os
import re

import aiohttp
import pytest
from aiohttp import web
from conftest import IN_CI, REPO
from sidecar_harness import FakeClock, start
from vllm_specdec_exporter.settings import build_settings
from vllm_specdec_exporter.web import POLLERS, create_app

GOLDEN = REPO / "tests" / "fixtures" / "golden" / "metrics.prom"
INPUT = REPO / "examples" / "broken-v4-pro-mtp"
# What depends on the machine, the wall clock or the build, not on the input.
VOLATILE = re.compile(
    r"^(# (HELP|TYPE) )?(process_|python_|vllm_specdec_exporter_build_info"
    r"|vllm_specdec_exporter_\w*(duration|seconds|timestamp|bytes)\w*)"
)


async def _scrape() -> str:
    bodies = [(INPUT / "before.prom").read_bytes(), (INPUT / "after.prom").read_bytes()]
    served = {"n": 0}

    async def handle(request: web.Request) -> web.Response:
        body = bodies[min(served["n"], 1)]
        served["n"] += 1
        return web.Response(body=body, content_type="text/plain")

    vllm = web.Application()
    vllm.router.add_get("/metrics", handle)
    runner, url = await start(vllm)
    clock = FakeClock()
    settings = build_settings({"poll": {"interval": "60s", "timeout": "2s"}},
                              {"urls": [f"{url}/metrics"], "listen_address": "127.0.0.1:0"})
    app = create_app(settings, mono=clock, start_polling=False)
    app_runner, app_url = await start(app)
    try:
        for _ in range(2):
            assert await app[POLLERS][0].poll_once() == "success"
            clock.t += 60
        clock.t -= 60  # scraped right after the second poll
        async with aiohttp.ClientSession() as session, session.get(app_url + "/metrics") as resp:
            assert resp.status == 200
            return await resp.text()
    finally:
        await app_runner.cleanup()
        await runner.cleanup()


def stable(text: str) -> str:
    return "".join(line + "\n" for line in text.splitlines() if not VOLATILE.match(line))


def test_metrics_for_the_broken_v4_pro_dumps_match_the_golden_file():
    got = stable(asyncio.run(_scrape()))
    if os.environ.get("UPDATE_GOLDEN") == "1":
        assert not IN_CI, "UPDATE_GOLDEN=1 under CI=true: the file would be compared with itself"
        GOLDEN.write_text(got)
    assert "vllm_specdec_mean_acceptance_length" in got  # the figures are in it, not only self-metrics
    assert got == GOLDEN.read_text(), "/metrics changed: diff it against tests/fixtures/golden/metrics.prom " \
        "(UPDATE_GOLDEN=1 rewrites the file when the change is deliberate)"


def test_two_runs_give_the_same_text():
    # What the comparison keeps depends on the input only.
    assert stable(asyncio.run(_scrape())) == stable(asyncio.run(_scrape()))


def test_what_the_broken_head_costs_is_the_hand_worked_figure():
    # Issue 34, through the real sidecar: the dumps are a minute of the broken V4-Pro conversion
    # (6,590 drafts, 235 + 5 accepted at positions 0 and 1: AL 1 + 240 / 6590) against its
    # profile's 2.27, at k=2 (break-even 1 + 0.05 x 2).
    text = asyncio.run(_scrape())
    al = 1 + 240 / 6590

    def value(name: str, window: str = "5m") -> float:
        found = re.findall(rf'^{name}{{[^}}]*window="{window}"[^}}]*}} (\S+)$', text, re.M)
        assert len(found) == 1, (name, found)
        return float(found[0])

    assert value("vllm_specdec_decode_step_factor_ratio") == pytest.approx(2.27 / al, rel=1e-12)  # 2.19
    assert value("vllm_specdec_decode_steps_wasted_ratio") == pytest.approx(1 - al / 2.27, rel=1e-12)  # 54 %
    assert value("vllm_specdec_healthy_output_tokens_per_second") == pytest.approx(6590 / 60 * 2.27, rel=1e-12)
    assert value("vllm_specdec_engine_decode_step_factor_ratio") == pytest.approx(2.27 / al, rel=1e-12)
    assert re.search(r'^vllm_specdec_break_even_mean_acceptance_length\{[^}]*\} 1\.1$', text, re.M)
