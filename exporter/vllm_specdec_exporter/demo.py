"""The live demo: the simulator and the real exporter on loopback, and a terminal
view that reads the exporter's own /metrics like any client would.

Every time in the demo is scenario time: with ``--speed 4`` the scenario runs four
times faster, and so do the exporter's windows, its poll and the view's refresh, so
the view shows what it shows at speed 1, sooner (the exporter's clock is real time,
its windows are the scenario's divided by the speed)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import sys
import time
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from . import config, durations, metrics
from .diagnosis import CAUSE_TEXT
from .errors import ConfigError
from .model import engine_order
from .parser import Sample, parse
from .render import bar, cost_text, one_line
from .scenarios import load_scenario
from .settings import Settings, build_settings
from .simulate import Simulation, create_simulator_app
from .web import create_app, start_site

# In scenario seconds. A short health window, so the view names a broken engine within
# seconds of the break (engine 5 at 40 s: falling at once, degraded after ~7 s, collapsed
# after ~20 s); the next window is what a fall is seen against; the longest is the
# sidecar's "earlier" (diagnosis.Earlier).
SCENARIO_WINDOWS = (20.0, 60.0, 300.0)
POLL_SECONDS = 1.0
REFRESH_SECONDS = 2.0
MIN_POLL_SECONDS = 0.25  # real seconds: a 0.3 MB payload fetched and parsed 4 times a second at most
MAX_SPEED = 40.0  # above it the 20 s window would hold fewer than two polls
# An engine is "falling" when its gain (AL - 1) over the shown window is under this share of
# its gain over the next window: 2 % lower (the simulator has no noise; the sidecar's health
# decides the rest).
FALLING = 0.98
WANTED = [
    metrics.name(n)
    for n in (
        "mean_acceptance_length",
        "acceptance_ratio",
        "position_acceptance_ratio",
        "baseline_mean_acceptance_length",
        "health",
        "engine_health",
        "window_drafts",
        "num_speculative_tokens",
        "engine_mean_acceptance_length",
        "up",
        "decode_step_factor_ratio",
        "decode_steps_wasted_ratio",
        "break_even_mean_acceptance_length",
        "diagnosis_info",
    )
] + [metrics.sample("exporter_engine_restarts")]
COLLAPSED_MARK, DEGRADED_MARK = "!", "~"


@dataclass(frozen=True, slots=True)
class Timing:
    """The demo's times at one speed: the exporter's window labels (real time; shown
    window first, then the one a fall is seen against), its poll and the view's refresh."""

    speed: float
    windows: tuple[str, ...]
    poll_seconds: float
    refresh_seconds: float
    degraded_fraction: float = config.DETECTION.degraded_fraction

    @property
    def shown(self) -> str:
        return self.windows[0]

    @property
    def against(self) -> str:
        return self.windows[1]

    @property
    def scenario_window(self) -> str:
        return f"{SCENARIO_WINDOWS[0]:g}s"


def timing(speed: float = 1.0) -> Timing:
    if not (math.isfinite(speed) and 0 < speed <= MAX_SPEED):
        raise ConfigError(
            "--speed",
            f"{speed:g} must be above 0 and at most {MAX_SPEED:g} (the {SCENARIO_WINDOWS[0]:g} s window must hold two polls)",
        )
    windows = tuple(_label(s / speed) for s in SCENARIO_WINDOWS)
    poll = min(max(POLL_SECONDS / speed, MIN_POLL_SECONDS), POLL_SECONDS)
    return Timing(speed, windows, poll, max(REFRESH_SECONDS / speed, 0.5))


def _label(seconds: float) -> str:
    """Whole milliseconds, spelled as the exporter labels a window (300s -> 5m)."""

    return durations.format_duration(round(seconds * 1000) / 1000)


def demo_settings(sim_url: str, listen_address: str, t: Timing) -> Settings:
    poll = f"{round(t.poll_seconds * 1000)}ms"
    return build_settings(
        {
            "windows": list(t.windows),
            "health": {"window": t.shown},
            "poll": {"interval": poll, "timeout": "2s", "max_backoff": "5s"},
        },
        {"urls": [f"demo={sim_url}/metrics"], "listen_address": listen_address, "log_level": "warning"},
    )


@dataclass(slots=True)
class Restarts:
    """The engine restarts the view saw the exporter count. /metrics tells no restart's time, only
    how many (exporter_engine_restarts_total, per target, one per engine restarted): a rise is
    dated by the last frame before it (the restart came after that frame's poll, give or take
    the poll that confirms it), so "N s ago" is within a refresh of the truth. What the counter
    held when the view started is no restart the view saw."""

    count: float | None = None
    last: float | None = None  # scenario seconds of the last frame that read the counter
    at: float | None = None  # the last rise's date: the frame before the one that showed it
    engines: int = 0  # engine restarts in that rise

    def see(self, count: float | None, elapsed: float) -> None:
        if count is None:
            return
        if self.count is not None and self.last is not None and count > self.count:
            self.at, self.engines = self.last, round(count - self.count)
        self.count, self.last = count, elapsed

    def within(self, elapsed: float, seconds: float) -> float | None:
        """Seconds since the last restart seen, while it is within the last ``seconds``."""
        if self.at is None or not 0 <= elapsed - self.at < seconds:
            return None
        return elapsed - self.at


async def _start(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    _, bound = await start_site(runner, host, port)
    return runner, f"http://{host}:{bound}"


def _engines_named(states: dict[str, str], total: int) -> str:
    """'engine 5 collapsed; engines 0, 1 falling', or 'all 8 engines ...' when every engine is named."""
    by_word: dict[str, list[str]] = {}
    for engine in sorted(states, key=engine_order):
        by_word.setdefault(states[engine], []).append(one_line(engine, 24))
    if len(by_word) == 1 and len(states) == total > 1:
        return f"all {total} engines {next(iter(by_word))}"
    parts = []
    for word, engines in by_word.items():
        shown = ", ".join(engines[:8]) + (f" and {len(engines) - 8} more" if len(engines) > 8 else "")
        parts.append(f"engine{'s' if len(engines) > 1 else ''} {shown} {word}")
    return (f"all {total} engines: " if len(states) == total > 1 else "") + "; ".join(parts)


def render_frame(
    body: bytes, elapsed: float, sim_url: str, exporter_url: str, t: Timing | None = None, restarts: Restarts | None = None
) -> str:
    """One frame from the exporter's /metrics ``body``; ``restarts``: what the earlier frames saw
    of the restart counter (run_demo keeps one), updated by this one."""
    t = t or timing()
    exp = parse(body, WANTED)

    def values(name: str, model: str | None = None, window: str | None = None, position: str | None = None) -> list[Sample]:
        match = {config.LABEL_MODEL: model, config.LABEL_WINDOW: window, config.LABEL_POSITION: position}
        return [
            s
            for s in exp.samples.get(metrics.name(name), [])
            if all(s.labels.get(k) == v for k, v in match.items() if v is not None)
        ]

    def first(name: str, model: str, window: str | None = None) -> float | None:
        found = values(name, model, window)
        return found[0].value if found and not math.isnan(found[0].value) else None

    lines = [
        f"vllm-specdec-exporter live demo   t={elapsed:5.0f} s"
        + (f"   (--speed {t.speed:g}: scenario seconds)" if t.speed != 1 else ""),
        f"  simulated vLLM: {sim_url}/metrics    exporter: {exporter_url}/  ({exporter_url}/metrics)",
        "",
    ]
    up = values("up")
    if up and up[0].value != 1.0:
        lines.append("  target down")
    restart_counts = exp.samples.get(metrics.sample("exporter_engine_restarts"), [])
    restarts = restarts if restarts is not None else Restarts()
    restarts.see(sum(s.value for s in restart_counts) if restart_counts else None, elapsed)
    # The shown window straddles the last restart seen: its figures mix the heads on both sides.
    since_restart = restarts.within(elapsed, SCENARIO_WINDOWS[0])
    over = f"the last {t.scenario_window}" + (f" (exporter window {t.shown} at --speed {t.speed:g})" if t.speed != 1 else "")
    for k_sample in values("num_speculative_tokens"):
        model, k = k_sample.labels[config.LABEL_MODEL], int(k_sample.value)
        state = next((s.labels[metrics.name("health")] for s in values("health", model) if s.value == 1.0), "-")
        al = first("mean_acceptance_length", model, t.shown)
        base = values("baseline_mean_acceptance_length", model)
        # The verdict's own threshold: degraded under 1 + degraded_fraction x (baseline - 1).
        floor = config.degraded_floor(t.degraded_fraction, base[0].value) if base else None
        engines = {s.labels[config.LABEL_ENGINE]: s.value for s in values("engine_mean_acceptance_length", model, t.shown)}
        before = {s.labels[config.LABEL_ENGINE]: s.value for s in values("engine_mean_acceptance_length", model, t.against)}
        verdicts = {
            s.labels[config.LABEL_ENGINE]: s.labels[metrics.name("engine_health")]
            for s in values("engine_health", model)
            if s.value == 1.0
        }
        named = {e: state for e, state in verdicts.items() if state in ("collapsed", "degraded")}
        every_engine_restarted = since_restart is not None and restarts.engines >= len(engines) > 0
        for engine, v in engines.items():
            # Across a restart of every engine the window's AL mixes the broken head with the
            # fixed one: "under" or "falling" would blame the engines for what the restart ended.
            if engine in named or math.isnan(v) or every_engine_restarted:
                continue
            if floor is not None and v < floor:
                named[engine] = f"under {floor:.3f}"
            elif engine in before and v - 1 < FALLING * (before[engine] - 1):
                named[engine] = "falling"
        parts = [_engines_named(named, len(engines))] if named else []
        if since_restart is not None:
            n = restarts.engines
            # The counter is the target's: "all" when it rose by at least the model's engines.
            if every_engine_restarted:
                who = f"all {len(engines)} engines restarted" if len(engines) > 1 else "its engine restarted"
            else:
                who = f"{n} engine restart{'s' if n != 1 else ''}"
            parts.append(
                f"{who} {since_restart:.0f} s ago: the window still holds "
                f"{SCENARIO_WINDOWS[0] - since_restart:.0f} s from before the restart"
            )
        why = f"  ({'; '.join(parts)})" if parts else ""
        drafts = values("window_drafts", model, t.shown)
        lines.append(f"model {one_line(model)}   k={k}   figures and health over {over}   health: {state.upper()}{why}")
        causes = [s.labels["cause"] for s in values("diagnosis_info", model) if s.value == 1.0]
        if causes:  # the landing page gives each one's evidence; /metrics names the cause
            texts = "; or ".join(CAUSE_TEXT.get(c, one_line(c, 40)) for c in causes)
            lines.append(f"  likely cause (a hint; the evidence is on the landing page): {texts}")
        # The threshold the verdict uses, not the profile's AL: OK at 2.1 under a profile of 2.27 is right.
        against = (
            f"healthy from {floor:.3f} = 1 + {t.degraded_fraction:g} x (profile {base[0].value:.2f} - 1)"
            if base and floor is not None
            else "no baseline profile"
        )
        lines.append(
            f"  mean acceptance length  {al if al is not None else float('nan'):6.3f}   {against}"
            f"   ceiling {k + 1:.2f}   drafts in window {drafts[0].value if drafts else 0:,.0f}"
        )
        # The exporter's own cost gauges over the shown window (capacity.py), against the profile.
        break_even = first("break_even_mean_acceptance_length", model)
        cost, *more = cost_text(
            first("decode_step_factor_ratio", model, t.shown),
            first("decode_steps_wasted_ratio", model, t.shown),
            base[0].value if base else None,
            al,
            break_even,
            None if al is None else (break_even is not None and al < break_even),
            "profile AL {}",
            "too few drafts in the window",
        )
        lines.append(f"  decode cost  {cost}")
        lines += [f"               {part}" for part in more]
        for pos in range(k):
            p = values("position_acceptance_ratio", model, t.shown, str(pos))
            frac = p[0].value if p else None
            lines.append(f"  position {pos}  {bar(frac)}  {'-' if frac is None else f'{100 * frac:5.1f} %'}")
        if engines:
            marks = {e: _mark(v, verdicts.get(e), floor) for e, v in engines.items()}
            cells = [
                f"{one_line(e, 24)}:{v:.2f}{marks[e]}" for e, v in sorted(engines.items(), key=lambda ev: engine_order(ev[0]))
            ]  # any label string
            legend = [
                f"{m} {word}" for m, word in ((COLLAPSED_MARK, "collapsed"), (DEGRADED_MARK, "degraded")) if m in marks.values()
            ]
            lines.append("  per engine AL  " + "  ".join(cells) + (f"   ({', '.join(legend)})" if legend else ""))
        lines.append("")
    lines.append("Ctrl-C stops both.")
    return "\n".join(lines)


def _mark(al: float, verdict: str | None, floor: float | None) -> str:
    """An engine's mark: collapsed (its head adds next to nothing, or the sidecar's verdict says
    so), else degraded (the sidecar's verdict, or under the model's degraded threshold)."""
    if math.isnan(al):
        return ""
    if verdict == "collapsed" or al < config.collapse_floor(config.DETECTION.collapse_margin):
        return COLLAPSED_MARK
    if verdict == "degraded" or (floor is not None and al < floor):
        return DEGRADED_MARK
    return ""


async def run_demo(
    scenario: str = "demo",
    speed: float = 1.0,
    duration: float | None = None,
    exporter_port: int = 9746,
    simulator_port: int = 18000,
    refresh: float | None = None,
) -> None:
    """``duration``: real seconds (a wall-clock stop); everything else runs in scenario time."""
    t = timing(speed)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    simulation = Simulation(load_scenario(scenario), speed=speed)
    sim_runner, sim_url = await _start(create_simulator_app(simulation), "127.0.0.1", simulator_port)
    settings = demo_settings(sim_url, f"127.0.0.1:{exporter_port}", t)
    exp_runner, exporter_url = await _start(create_app(settings), "127.0.0.1", exporter_port)
    tty = sys.stdout.isatty()
    restarts = Restarts()
    started = time.monotonic()
    print(
        f"simulator: {sim_url}/metrics\nexporter:  {exporter_url}/   {exporter_url}/metrics   "
        f"{exporter_url}/api/v1/summary?window={t.shown}\n",
        flush=True,
    )
    try:
        async with aiohttp.ClientSession() as session:
            while not stop.is_set():
                async with session.get(f"{exporter_url}/metrics") as resp:
                    body = await resp.read()
                frame = render_frame(body, simulation.elapsed, sim_url, exporter_url, t, restarts)
                print(("\x1b[H\x1b[2J" if tty else "\n") + frame, flush=True)
                left = None if duration is None else duration - (time.monotonic() - started)
                if left is not None and left <= 0:
                    break
                with contextlib.suppress(TimeoutError):  # the refresh interval passed, or the duration
                    await asyncio.wait_for(stop.wait(), min(refresh or t.refresh_seconds, left or math.inf))
    finally:
        await exp_runner.cleanup()
        await sim_runner.cleanup()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        print("demo stopped: simulator and exporter shut down.", flush=True)
