"""The landing page's render cost at the documented engine cap (4,096 engines held).

    .venv/bin/python bench/bench_landing.py [--polls 65] [--renders 20]

The exporter app in-process, on a fake clock: a loopback server serves vLLM-shaped
counters of 4,096 engines (k=8), polled once per fake minute for an hour and more, so the
longest window (1h) is full; engine acceptance falls after poll 40. Then GET / is timed
over loopback (the handler runs on the event loop). Two shapes: one model of 4,096
engines (the engine table is the page), and 64 models of 64 engines (the most models a
target holds: one chart per model). The handler's CPU time (median; the page is built on the
event loop) and GET /'s wall time. Prints `name: value` lines.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import aiohttp
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from vllm_specdec_exporter import logs
from vllm_specdec_exporter.settings import build_settings
from vllm_specdec_exporter.web import PAGES, POLLERS, create_app, landing, start_site

K = 8
V1 = "vllm:spec_decode_num_"
HEALTHY = tuple(0.8 ** (i + 1) for i in range(K))
BROKEN = tuple(0.04 * 0.3**i for i in range(K))
BREAK_AT = 40  # the poll from which every engine's head is broken


def payload(n: int, models: int, engines: int) -> bytes:
    """Cumulative counters after poll ``n``: 100,000 drafts per engine per poll."""
    d = 100_000
    # Whole tokens per position, and accepted as their sum: vLLM's own invariant (a rounded sum of
    # the fractions was one over it, and every engine was judged on broken counters).
    per = [int(sum(d * (HEALTHY if p < BREAK_AT else BROKEN)[i] for p in range(n + 1))) for i in range(K)]
    drafts = d * (n + 1)
    out = []
    for m in range(models):
        model = "deepseek-ai/DeepSeek-V4-Pro" if models == 1 else f"deepseek-ai/DeepSeek-V4-Pro-{m}"
        for e in range(engines):
            lab = f'engine="{e}",model_name="{model}"'
            out.append(
                f"{V1}drafts_total{{{lab}}} {drafts}\n{V1}draft_tokens_total{{{lab}}} {K * drafts}\n"
                f"{V1}accepted_tokens_total{{{lab}}} {sum(per)}\n"
            )
            out += [f'{V1}accepted_tokens_per_pos_total{{{lab},position="{i}"}} {v}\n' for i, v in enumerate(per)]
    return "".join(out).encode()


async def measure(models: int, engines: int, polls: int, renders: int) -> dict[str, float]:
    state = {"n": 0}

    async def metrics(request: web.Request) -> web.Response:
        body = payload(state["n"], models, engines)
        state["n"] += 1
        return web.Response(body=body, content_type="text/plain")

    vllm = web.Application()
    vllm.router.add_get("/metrics", metrics)
    vllm_runner = web.AppRunner(vllm, access_log=None)
    await vllm_runner.setup()
    _, vport = await start_site(vllm_runner, "127.0.0.1", 0)
    clock = {"t": 1000.0}
    settings = build_settings(
        {"poll": {"interval": "60s"}, "max_series_per_target": 4096, "min_drafts": 1},
        {"urls": [f"http://127.0.0.1:{vport}/metrics"], "listen_address": "127.0.0.1:0"},
    )
    app = create_app(settings, mono=lambda: clock["t"], start_polling=False)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    _, port = await start_site(runner, "127.0.0.1", 0)
    poller = app[POLLERS][0]
    for _ in range(polls):
        clock["t"] += 60.0
        assert await poller.poll_once() == "success", poller.view.last_error
    # The handler's own CPU time (this thread's: what the event loop spends, whatever else the
    # machine runs), then the wall time of GET / over loopback.
    request = make_mocked_request("GET", "/", app=app)
    cpu = []
    # The page is built once per state (web.per_state): forget it before each render, which is what this measures.
    for _ in range(renders):
        app[PAGES].clear()
        started = time.thread_time()
        await landing(request)
        cpu.append(time.thread_time() - started)
    times, size = [], 0
    async with aiohttp.ClientSession() as session:
        for _ in range(renders):
            app[PAGES].clear()
            started = time.perf_counter()
            async with session.get(f"http://127.0.0.1:{port}/") as resp:
                body = await resp.read()
            times.append(time.perf_counter() - started)
            size = len(body)
    await runner.cleanup()
    await vllm_runner.cleanup()
    return {
        "first_cpu_ms": 1000 * cpu[0],  # the charts built (a step added a point); then drawn from the last render's
        "cpu_ms": 1000 * statistics.median(cpu),
        "median_ms": 1000 * statistics.median(times),
        "worst_ms": 1000 * max(times),
        "bytes": size,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--polls", type=int, default=65)
    ap.add_argument("--renders", type=int, default=30)
    args = ap.parse_args()
    logs.configure("console", "warning")
    for models, engines in ((1, 4096), (64, 64)):
        r = asyncio.run(measure(models, engines, args.polls, args.renders))
        shape = f"{models}_models_x_{engines}_engines_k{K}"
        print(f"landing_handler_first_cpu_ms_{shape}: {r['first_cpu_ms']:.1f}")
        print(f"landing_handler_cpu_ms_{shape}: {r['cpu_ms']:.1f}")
        print(f"landing_render_median_ms_{shape}: {r['median_ms']:.1f}")
        print(f"landing_render_worst_ms_{shape}: {r['worst_ms']:.1f}")
        print(f"landing_bytes_{shape}: {r['bytes']:,}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
