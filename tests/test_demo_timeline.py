"""The demo never misleads (issue 24): its simulator and the real exporter, with the
demo's own settings (demo.demo_settings), driven on a fake clock; every poll the
terminal frame is rendered from /metrics as `make demo` renders it.

The built-in scenario (data/scenarios/demo.yaml): healthy (AL 2.61), engine 5's head
breaks at 40 s, every engine's at 100 s (so from 100 s to ~120 s every engine is falling
in the 20 s window), and a restart with a fixed head at 160 s.

(a) from 101 s to 119 s the health line names all 8 engines, not engine 5 alone;
(b) the state shown is the sidecar's verdict over the same window as the figures shown,
    and never OK while the AL shown is under the threshold the line prints (the verdict's
    own: 1 + 0.75 x (profile 2.27 - 1) = 1.953, not the profile's 2.27);
(c) after the fixing restart no surface names a configuration change as the likely
    cause (the fall began 60 s before it);
(d) at --speed 4 the exporter's windows are the scenario's divided by 4, so COLLAPSED
    shows by 121 s of scenario time, as at speed 1;
(e) issue 34 item 6: at the collapse the frame gives the likely cause and the cost line (the
    exporter's cost gauges), marks a degraded engine apart from a collapsed one, and while the
    window straddles the fixing restart says "restarted N s ago", not "all 8 engines under 1.953".
(f) while the window straddles the fixing restart (161-179 s) no likely cause is read from the
    mix of the broken head before it and the healthy one after it (that mix once read as a
    workload shift, then as a partly broken head): the cause is read from the counters since
    the restart alone, where nothing fell.
Plus the landing page: it refreshes itself and says when it was rendered.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field

import aiohttp
import pytest
from sidecar_harness import FakeClock, start
from vllm_specdec_exporter import config, demo
from vllm_specdec_exporter.parser import parse
from vllm_specdec_exporter.scenarios import load_scenario
from vllm_specdec_exporter.settings import ConfigError
from vllm_specdec_exporter.simulate import Simulation, create_simulator_app
from vllm_specdec_exporter.web import POLLERS, create_app

ENGINES = [str(e) for e in range(8)]


@dataclass
class Frame:
    t: float  # scenario seconds
    text: str
    health: str  # the sidecar's verdict (its view), for comparison with the frame
    al: float | None  # the sidecar's AL over its health window
    causes: tuple[str, ...]
    info_causes: tuple[str, ...]  # from /metrics (diagnosis_info)

    @property
    def health_line(self) -> str:
        return next(ln for ln in self.text.splitlines() if "health:" in ln)

    @property
    def state(self) -> str:
        return self.health_line.split("health: ")[1].split()[0]

    @property
    def al_line(self) -> str:
        return next(ln for ln in self.text.splitlines() if ln.startswith("  mean acceptance length"))

    @property
    def shown_al(self) -> float:
        return float(self.al_line.split()[3])

    @property
    def shown_floor(self) -> float:
        return float(self.al_line.split("healthy from ")[1].split()[0])


@dataclass
class Timeline:
    timing: demo.Timing
    health_window: str
    frames: list[Frame] = field(default_factory=list)
    pages: dict[float, str] = field(default_factory=dict)

    def between(self, lo: float, hi: float) -> list[Frame]:
        return [f for f in self.frames if lo <= f.t <= hi]


async def run_demo_timeline(speed: float, start_at: float, end_at: float, pages_at: tuple[float, ...] = (),
                            monkeypatch: pytest.MonkeyPatch | None = None) -> Timeline:
    if monkeypatch is not None:  # the 0.3 MB payload parsed inline: the same code, no process hop
        monkeypatch.setattr(config, "PARSE_IN_WORKER_BYTES", 1 << 30)
    clock = FakeClock()
    t = demo.timing(speed)
    sim = Simulation(load_scenario("demo"), clock=clock, speed=speed)
    sim_runner, sim_url = await start(create_simulator_app(sim))
    settings = demo.demo_settings(sim_url, "127.0.0.1:0", t)
    app = create_app(settings, mono=clock, start_polling=False)
    exp_runner, exp_url = await start(app)
    timeline = Timeline(t, settings.health_window)
    wanted_pages = sorted(pages_at)
    restarts = demo.Restarts()  # as run_demo keeps it across frames
    try:
        async with aiohttp.ClientSession() as session:
            clock.t += start_at / speed  # the scenario runs unobserved until then
            poller = app[POLLERS][0]
            await poller.poll_once()
            while sim.elapsed < end_at:
                clock.t += t.poll_seconds
                # The fake clock stands still while a poll runs: one that timed out on a busy
                # machine (2 s of real time) is polled again at the same scenario time.
                results = [await poller.poll_once()]
                while results[-1] != "success" and len(results) < 3:
                    results.append(await poller.poll_once())
                assert results[-1] == "success", results
                async with session.get(exp_url + "/metrics") as resp:
                    body = await resp.read()
                mv = poller.view.models[0]
                w = mv.windows.get(settings.health_window)
                info = tuple(s.labels["cause"] for s in parse(body).samples.get(
                    "vllm_specdec_diagnosis_info", []))
                timeline.frames.append(Frame(
                    sim.elapsed, demo.render_frame(body, sim.elapsed, sim_url, exp_url, t, restarts), mv.health,
                    w.stats.mean_acceptance_length if w else None, tuple(h.cause for h in mv.health_causes), info))
                if wanted_pages and sim.elapsed >= wanted_pages[0]:
                    async with session.get(exp_url + "/") as resp:
                        timeline.pages[wanted_pages.pop(0)] = await resp.text()
    finally:
        await exp_runner.cleanup()
        await sim_runner.cleanup()
    return timeline


def check_all_falling_engines_named(timeline: Timeline) -> None:
    """(a) Every engine falls from 100 s: by 101 s (1 s of it in the 20 s window) the line
    names all 8, until they are all collapsed (then 'all 8 engines collapsed')."""
    frames = timeline.between(101, 119.5)
    assert frames
    for f in frames:
        line = f.health_line
        assert "all 8 engines" in line, (f.t, line)
        assert "(engine 5 collapsed)" not in line, (f.t, line)
    assert all("(all 8 engines collapsed)" in f.health_line for f in timeline.between(125, 159)), \
        [f.health_line for f in timeline.between(125, 159)]


def check_never_ok_under_the_threshold(timeline: Timeline) -> None:
    """(b) The frame's state and AL are the sidecar's own over the one window, and OK never
    shows under the threshold the line prints."""
    assert timeline.timing.shown == timeline.health_window
    states = set()
    for f in timeline.frames:
        states.add(f.state)
        assert f.state == f.health.upper(), (f.t, f.health_line, f.health)
        assert f"{f.shown_al:.3f}" == f"{f.al:.3f}", (f.t, f.al_line, f.al)
        assert f.shown_floor == 1.953, f.al_line  # 1 + 0.75 x (2.27 - 1) = 1.9525
        assert "baseline" not in f.al_line  # the profile is shown as such, beside the threshold
        if f.state == "OK":
            assert f.shown_al >= f.shown_floor, (f.t, f.health_line, f.al_line)
        if f.shown_al < f.shown_floor:
            assert f.state != "OK", (f.t, f.health_line, f.al_line)
    return None


def check_restart_not_blamed(timeline: Timeline) -> None:
    """(c) The restart at 160 s fixed a fall that began at 100 s: never its cause."""
    after = timeline.between(160, 200)
    assert after
    for f in after:
        assert "configuration_change" not in f.causes, (f.t, f.causes)
        assert "configuration_change" not in f.info_causes, (f.t, f.info_causes)
    assert {f.health for f in after} >= {"degraded", "ok"}  # the window still held the fall, then recovered


def check_no_cause_from_before_the_fixing_restart(timeline: Timeline) -> None:
    """(f) Every engine restarted at 160 s with a healthy head: while the 20 s window still holds
    the collapse before it (and the verdict is still degraded), the causes are those of the
    counters since the restart, where nothing fell: none, on the view and on /metrics."""
    straddle = timeline.between(161, 179)
    assert straddle and {f.health for f in straddle} >= {"degraded"}
    for f in straddle:
        assert f.causes == () and f.info_causes == (), (f.t, f.health, f.causes, f.info_causes)
        assert "likely cause" not in f.text, (f.t, f.text)
    for at, page in timeline.pages.items():
        if 160 < at < 180:
            assert "workload shift" not in page and "partly broken draft head" not in page, at


def cells(f: Frame) -> dict[str, str]:
    """The per-engine cells of a frame: engine -> its AL with its mark ("1.04!", "1.82~")."""
    line = next((ln for ln in f.text.splitlines() if ln.startswith("  per engine AL")), None)
    assert line is not None, (f.t, f.text)
    return dict(c.split(":") for c in line.split("(")[0].split()[3:])


def check_cause_cost_marks_and_restart(timeline: Timeline, whole: bool = True) -> None:
    """(e) Figures by hand. At the collapse the AL is 1.035-1.037 (position 0 at 3.57 %, 1 at
    0.08 %) against the profile's 2.27: 2.27 / 1.036 = 2.19x the decode steps, 1 - 1.036 / 2.27
    = 54 % wasted, under the break-even 1 + 0.05 x k=2 = 1.100. ``whole``: the timeline has
    the healthy start and the restart (0-200 s)."""
    collapse = timeline.between(125, 159)
    assert collapse
    for f in collapse:
        assert "likely cause (a hint; the evidence is on the landing page): the draft head produces garbage" in f.text, f.text
        assert "  decode cost  2.19x the decode steps of a healthy head (profile AL 2.27): 54 % of decode work wasted\n" in f.text, f.text
        assert ("AL 1.03" in f.text and "is under the break-even 1.100: speculative decoding is currently slower than no "
                "speculative decoding") in f.text, f.text
        assert set(cells(f).values()) <= {"1.03!", "1.04!"} and "(! collapsed)" in f.text, cells(f)
    # From 100 s every head is broken: 10 s in (110 s), the seven engines that were healthy
    # read (2.611 + 1.036) / 2 = 1.82 over the 20 s window, under 1.953 but far from collapsed:
    # marked degraded (~), engine 5 collapsed (!).
    for f in timeline.between(110, 118):
        c = cells(f)
        assert c.pop("5").endswith("!") and all(v.endswith("~") for v in c.values()), (f.t, cells(f))
        assert "(! collapsed, ~ degraded)" in f.text
    assert {cells(f)["0"] for f in timeline.between(110, 110)} == {"1.82~"}
    # Engine 5 alone, 8-18 s into its fall: degraded (~), not collapsed (!), the others unmarked.
    for f in timeline.between(48, 58):
        c = cells(f)
        assert c.pop("5").endswith("~") and not any(v.endswith(("~", "!")) for v in c.values()), (f.t, cells(f))
    if not whole:
        return
    # Healthy: nothing wasted, no cause, no mark (AL 2.61 over the profile's 2.27).
    assert timeline.between(20, 40)
    for f in timeline.between(20, 40):
        assert "decode cost  no decode steps wasted: AL 2.61" in f.text and "likely cause" not in f.text, f.text
        assert set(cells(f).values()) == {"2.61"}, cells(f)
    # The fixing restart at 160 s: first counted by the 161 s frame, dated by the frame before
    # (160 s); until 180 s the 20 s window holds counters from before it.
    straddle = timeline.between(161, 179)
    assert straddle
    for f in straddle:
        line = f.health_line
        ago = f.t - 160
        assert f"all 8 engines restarted {ago:.0f} s ago: the window still holds {20 - ago:.0f} s from before the restart" in line, (f.t, line)
        assert "under 1.953" not in line, (f.t, line)
    assert all("restarted" not in f.text for f in timeline.between(180, 200))
    assert all("restarted" not in f.text for f in timeline.between(0, 160))
    assert all(v.endswith("~") for v in cells(timeline.between(165, 165)[0]).values())  # 1.45: degraded, not collapsed


def test_timing_scales_windows_poll_and_refresh_with_speed():
    one = demo.timing(1)
    assert one.windows == ("20s", "1m", "5m") and one.poll_seconds == 1.0 and one.refresh_seconds == 2.0
    four = demo.timing(4)
    assert four.windows == ("5s", "15s", "75s") and four.poll_seconds == 0.25 and four.refresh_seconds == 0.5
    assert demo.timing(3).windows == ("6667ms", "20s", "100s")
    assert demo.timing(0.5).windows == ("40s", "2m", "10m") and demo.timing(0.5).poll_seconds == 1.0
    for bad in (0, -1, 41, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="--speed"):
            demo.timing(bad)
    settings = demo.demo_settings("http://127.0.0.1:1", "127.0.0.1:0", four)
    assert [w for w, _ in settings.windows] == ["5s", "15s", "75s"] and settings.health_window == "5s"
    assert settings.poll_interval == 0.25


@pytest.mark.long
def test_the_demo_timeline_at_speed_1(monkeypatch):
    timeline = asyncio.run(run_demo_timeline(1.0, 0.0, 200.0, pages_at=(110.0, 165.0, 175.0), monkeypatch=monkeypatch))
    check_all_falling_engines_named(timeline)
    check_never_ok_under_the_threshold(timeline)
    check_restart_not_blamed(timeline)
    check_cause_cost_marks_and_restart(timeline)
    check_no_cause_from_before_the_fixing_restart(timeline)
    # The timeline the scenario describes, and the state at each phase.
    assert all(f.state == "OK" and "engine" not in f.health_line for f in timeline.between(1, 40))
    assert all("engine 5" in f.health_line for f in timeline.between(42, 100))
    assert all(f.state == "COLLAPSED" for f in timeline.between(121, 160))
    assert all(f.state == "OK" and "(" not in f.health_line.split("health:")[1] for f in timeline.between(180, 200))
    # The landing page: the same verdict, the threshold, a refresh, when it was rendered;
    # and after the restart no configuration change as the likely cause.
    for at, page in timeline.pages.items():
        assert '<meta http-equiv=refresh content=5>' in page
        assert re.search(r"Built \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, at the last poll or target going stale; "
                         r"this page refreshes itself every 5 s", page)
        assert "healthy from 1.953 = 1 + 0.75 x (baseline - 1)" in page
        if at >= 160:
            assert "configuration change" not in page, at
    assert "health: <b>degraded</b>" in timeline.pages[110.0]
    assert "health: <b>degraded</b>" in timeline.pages[165.0]


@pytest.mark.long
def test_the_demo_timeline_at_speed_4_is_the_same_in_scenario_time(monkeypatch):
    """(d) At --speed 4 the 20 s window is 5 s of the exporter's time: the view at 101-160 s
    of the scenario is the speed-1 view (all 8 named while falling, then COLLAPSED)."""
    timeline = asyncio.run(run_demo_timeline(4.0, 38.0, 162.0, monkeypatch=monkeypatch))  # 1m full by 100 s
    assert timeline.health_window == "5s"
    assert "figures and health over the last 20s (exporter window 5s at --speed 4)" in timeline.frames[-1].text
    check_all_falling_engines_named(timeline)
    check_never_ok_under_the_threshold(timeline)
    check_cause_cost_marks_and_restart(timeline, whole=False)  # from 38 s to 162 s
    collapsed = [f.t for f in timeline.frames if f.state == "COLLAPSED"]
    assert collapsed and 119 <= collapsed[0] <= 122, collapsed[:3]
    assert all(f.state == "COLLAPSED" for f in timeline.between(122, 160))
    assert all("engine 5" not in f.health_line for f in timeline.between(38, 40))
    assert all(f.state == "DEGRADED" and "(engine 5 degraded)" in f.health_line for f in timeline.between(48, 59))
    assert all(f.state == "DEGRADED" and "(engine 5 collapsed)" in f.health_line for f in timeline.between(62, 100))


def exposition(restarts: float, profile: bool = True, al: float | None = 1.036, health: str = "collapsed",
               engines: dict[str, tuple[float, str]] | None = None) -> bytes:
    """A /metrics body with what the demo view reads, written out by hand (one model, k=2,
    the 20s window): AL 1.036 against the profile's 2.27 gives 2.27 / 1.036 = 2.19x and
    1 - 1.036 / 2.27 = 54 % wasted, under the break-even 1 + 0.05 x 2 = 1.1."""
    m = 'target="demo",model_name="m"'
    engines = engines if engines is not None else {"0": (1.036, "collapsed"), "1": (1.5, "degraded"), "2": (2.5, "ok")}
    lines = [
        'vllm_specdec_up{target="demo"} 1',
        f'vllm_specdec_exporter_engine_restarts_total{{target="demo"}} {restarts}',
        f"vllm_specdec_num_speculative_tokens{{{m}}} 2",
        f"vllm_specdec_break_even_mean_acceptance_length{{{m}}} 1.1",
        f'vllm_specdec_health{{{m},vllm_specdec_health="{health}"}} 1',
        f'vllm_specdec_diagnosis_info{{{m},cause="draft_head_garbage"}} 1',
        f'vllm_specdec_window_drafts{{{m},window="20s"}} {6400 if al is not None else 40}',
    ]
    if profile:
        lines.append(f'vllm_specdec_baseline_mean_acceptance_length{{{m},profile="p"}} 2.27')
    if al is not None:
        lines.append(f'vllm_specdec_mean_acceptance_length{{{m},window="20s"}} {al}')
        if profile:
            lines.append(f'vllm_specdec_decode_step_factor_ratio{{{m},window="20s"}} {2.27 / al}')
            lines.append(f'vllm_specdec_decode_steps_wasted_ratio{{{m},window="20s"}} {max(0.0, 1 - al / 2.27)}')
    for e, (e_al, state) in engines.items():
        lines.append(f'vllm_specdec_engine_mean_acceptance_length{{{m},engine="{e}",window="20s"}} {e_al}')
        lines.append(f'vllm_specdec_engine_health{{{m},engine="{e}",vllm_specdec_engine_health="{state}"}} 1')
    return ("\n".join(lines) + "\n").encode()


def test_the_frame_gives_the_cause_the_cost_the_marks_and_a_restart_in_the_window():
    """(e) on hand-written /metrics: the same points without the simulator."""
    restarts = demo.Restarts()

    def frame(body: bytes, at: float) -> str:
        return demo.render_frame(body, at, "http://sim", "http://exp", demo.timing(1), restarts)

    text = frame(exposition(0), 100)
    assert "likely cause (a hint; the evidence is on the landing page): the draft head produces garbage" in text
    assert "  decode cost  2.19x the decode steps of a healthy head (profile AL 2.27): 54 % of decode work wasted\n" in text
    assert ("               AL 1.036 is under the break-even 1.100: speculative decoding is currently slower than no "
            "speculative decoding: consider turning it off until the head is fixed\n") in text
    assert "  per engine AL  0:1.04!  1:1.50~  2:2.50   (! collapsed, ~ degraded)" in text
    assert "restarted" not in text  # the count the view started with is no restart it saw
    # The counter rises by 3 (every engine) between the frames at 102 and 104: dated 102.
    assert "restarted" not in frame(exposition(0), 102)
    text = frame(exposition(3, health="degraded"), 104)
    assert "health: DEGRADED  (engine 0 collapsed; engine 1 degraded; all 3 engines restarted 2 s ago: the window still " \
           "holds 18 s from before the restart)" in text, text
    assert "restarted 19 s ago" in frame(exposition(3), 121)
    assert "restarted" not in frame(exposition(3), 122)  # the window is past it
    # One restart of three engines: not "all"; the engines under the threshold are still named.
    text = frame(exposition(4, health="degraded", engines={"0": (1.9, "ok"), "1": (2.5, "ok"), "2": (2.5, "ok")}), 124)
    assert "(engine 0 under 1.953; 1 engine restart 2 s ago: the window still holds 18 s from before the restart)" in text
    assert "0:1.90~  1:2.50  2:2.50   (~ degraded)" in text
    # No profile: the cost unknown, never 0 %; the break-even still said. Too few drafts: no figure.
    text = frame(exposition(4, profile=False), 126)
    assert "  decode cost  unknown: no baseline profile, so no healthy AL to count wasted decode steps against\n" in text
    assert "AL 1.036 is under the break-even 1.100" in text and "% of decode work wasted" not in text
    text = frame(exposition(4, al=None), 128)
    assert "  decode cost  no figure: too few drafts in the window\n" in text
    # At or above the profile: nothing wasted.
    text = frame(exposition(4, al=2.6, health="ok", engines={"0": (2.6, "ok")}), 130)
    assert "  decode cost  no decode steps wasted: AL 2.600 is at or above the healthy AL (profile AL 2.27)\n" in text
