"""The live demo: the simulator and the real exporter on loopback, and a terminal
view that reads the exporter's own /metrics like any client would."""

from __future__ import annotations

import asyncio
import contextlib

import signal
import sys
import time

import aiohttp
from aiohttp import web

from . import config, metrics
from .parser import Sample, parse
from .render import _safe, bar
from .settings import build_settings
from .simulate import Simulation, create_simulator_app, load_scenario
from .summary import engine_order
from .web import create_app, start_site

# A short health window, so the view names a broken engine within seconds of the break
# (engine 5 at 40 s: lagging after ~6 s, collapsed after ~20 s), and says which window it shows.
DEMO_WINDOW = "20s"
DEMO_WINDOWS = [DEMO_WINDOW, "1m", "5m"]
WANTED = [metrics.name(n) for n in ("mean_acceptance_length", "acceptance_ratio", "position_acceptance_ratio",
                               "baseline_mean_acceptance_length", "health", "engine_health", "window_drafts",
                               "num_speculative_tokens", "engine_mean_acceptance_length", "up")]


async def _start(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    _, bound = await start_site(runner, host, port)
    return runner, f"http://{host}:{bound}"


def render_frame(body: bytes, elapsed: float, sim_url: str, exporter_url: str) -> str:
    exp = parse(body, WANTED)

    def values(name: str, model: str | None = None, window: str | None = None, position: str | None = None) -> list[Sample]:
        match = {config.LABEL_MODEL: model, config.LABEL_WINDOW: window, config.LABEL_POSITION: position}
        return [s for s in exp.samples.get(metrics.name(name), [])
                if all(s.labels.get(k) == v for k, v in match.items() if v is not None)]

    lines = [f"vllm-specdec-exporter live demo   t={elapsed:5.0f} s",
             f"  simulated vLLM: {sim_url}/metrics    exporter: {exporter_url}/  ({exporter_url}/metrics)", ""]
    up = values("up")
    if up and up[0].value != 1.0:
        lines.append("  target down")
    for k_sample in values("num_speculative_tokens"):
        model, k = k_sample.labels[config.LABEL_MODEL], int(k_sample.value)
        state = next((s.labels[metrics.name("health")] for s in values("health", model) if s.value == 1.0), "-")
        bad = sorted(((s.labels[config.LABEL_ENGINE], s.labels[metrics.name("engine_health")]) for s in values("engine_health", model)
                      if s.value == 1.0 and s.labels[metrics.name("engine_health")] in ("collapsed", "degraded")),
                     key=lambda es: (len(es[0]), es[0]))
        why = f"  ({', '.join(f'engine {_safe(e, 24)} {st}' for e, st in bad)})" if bad else ""
        al = values("mean_acceptance_length", model, DEMO_WINDOW)
        base = values("baseline_mean_acceptance_length", model)
        drafts = values("window_drafts", model, DEMO_WINDOW)
        lines.append(f"model {_safe(model)}   k={k}   figures and health over the last {DEMO_WINDOW}   "
                     f"health: {state.upper()}{why}")
        lines.append(f"  mean acceptance length  {al[0].value if al else float('nan'):6.3f}"
                     f"   baseline {base[0].value if base else float('nan'):.2f}   ceiling {k + 1:.2f}"
                     f"   drafts in window {drafts[0].value if drafts else 0:,.0f}")
        for pos in range(k):
            p = values("position_acceptance_ratio", model, DEMO_WINDOW, str(pos))
            frac = p[0].value if p else None
            lines.append(f"  position {pos}  {bar(frac)}  {'-' if frac is None else f'{100 * frac:5.1f} %'}")
        engines = sorted(values("engine_mean_acceptance_length", model, DEMO_WINDOW),
                         key=lambda s: engine_order(s.labels[config.LABEL_ENGINE]))  # any label string
        if engines:
            cells = [f"{_safe(s.labels[config.LABEL_ENGINE], 24)}:{s.value:.2f}{'!' if s.value - 1 < config.DEFAULT_COLLAPSE_MARGIN else ''}"
                     for s in engines]
            lines.append("  per engine AL  " + "  ".join(cells))
        lines.append("")
    lines.append("Ctrl-C stops both.")
    return "\n".join(lines)


async def run_demo(scenario: str = "demo", speed: float = 1.0, duration: float | None = None,
                   exporter_port: int = 9746, simulator_port: int = 18000, refresh: float = 2.0) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    simulation = Simulation(load_scenario(scenario), speed=speed)
    sim_runner, sim_url = await _start(create_simulator_app(simulation), "127.0.0.1", simulator_port)
    settings = build_settings(
        {"windows": DEMO_WINDOWS, "health": {"window": DEMO_WINDOW}, "poll": {"interval": "1s"}},
        {"urls": [f"demo={sim_url}/metrics"], "listen_address": f"127.0.0.1:{exporter_port}", "log_level": "warning"},
    )
    exp_runner, exporter_url = await _start(create_app(settings), "127.0.0.1", exporter_port)
    tty = sys.stdout.isatty()
    started = time.monotonic()
    print(f"simulator: {sim_url}/metrics\nexporter:  {exporter_url}/   {exporter_url}/metrics   "
          f"{exporter_url}/api/v1/summary?window={DEMO_WINDOW}\n", flush=True)
    try:
        async with aiohttp.ClientSession() as session:
            while not stop.is_set():
                async with session.get(f"{exporter_url}/metrics") as resp:
                    body = await resp.read()
                frame = render_frame(body, simulation.elapsed, sim_url, exporter_url)
                print(("\x1b[H\x1b[2J" if tty else "\n") + frame, flush=True)
                if duration is not None and time.monotonic() - started >= duration:
                    break
                with contextlib.suppress(TimeoutError):  # the refresh interval passed
                    await asyncio.wait_for(stop.wait(), refresh)
    finally:
        await exp_runner.cleanup()
        await sim_runner.cleanup()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        print("demo stopped: simulator and exporter shut down.", flush=True)
