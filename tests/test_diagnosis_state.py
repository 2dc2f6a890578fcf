"""Issue 32: every window of /api/v1/summary reads what the poller saw as the health window does.

The diagnosis state (diagnosis_state.DiagnosisState) holds the restarts and k changes per window,
each as the health window's would be were it the health window, with the model over that window
just before them. So /api/v1/summary?window=W of a sidecar whose health window is 5m names the
causes, with the same evidence, that /metrics, the landing page and the view of a sidecar whose
health window is W name. Before, the other windows read the health window's: a restart 15
minutes back was forgotten once 5 minutes had passed, and the 15m summary said "with no restart
or k change"; the 1m summary read the figures before a restart over 5 minutes.

Every expected figure is worked by hand from the served counters.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import run_cli
from sidecar_harness import T0, V1, Sidecar, dump
from vllm_specdec_exporter.config import DETECTION
from vllm_specdec_exporter.diagnosis_state import position0_healthy
from vllm_specdec_exporter.model import Counters
from vllm_specdec_exporter.parser import parse
from vllm_specdec_exporter.web import POLLERS

PRO = "deepseek-ai/DeepSeek-V4-Pro"


async def metrics_causes(s: Sidecar) -> set[str]:
    async with s.session.get(s.url + "/metrics") as r:
        samples = parse(await r.text()).samples
    return {x.labels["cause"] for x in samples.get("vllm_specdec_diagnosis_info", [])}


def same_causes_as_the_health_window(serve, until: float, window: str) -> list[tuple[str, str]]:
    """The summary over ``window`` of a sidecar on the default 5m health window, checked against
    what a sidecar whose health window is ``window`` shows on /metrics, the landing page and its
    view, polled alike; returns the summary's (cause, evidence)."""

    async def go():
        async with Sidecar(serve, T0 + 10) as a, Sidecar(serve, T0 + 10, {"health": {"window": window}}) as b:
            await a.poll_until(until)
            await b.poll_until(until)
            summary = [(d["cause"], d["evidence"]) for d in (await a.summary(window))["diagnosis"]]
            view = [(h.cause, h.evidence) for h in b.model().health_causes]
            assert summary == view
            assert await metrics_causes(b) == {c for c, _ in view}
            page = await b.page()
            assert all(evidence in page for _, evidence in view)
            return summary

    return asyncio.run(go())


def test_the_15m_summary_names_a_restart_the_5m_window_has_forgotten():
    """V4-Pro k=2 at 92.4 % / 68.7 % (AL 2.611) at 50 drafts/s, then a restart (_created 3,000 s
    later) into 80 % / 40 % (AL 2.200): the gain at 1.2 / 1.611 = 74.5 % of what it was, every
    position lower, above the profile's floor: ok, with a drift that came with the restart. 905 s
    on, the 5m health window has stood for over 5 minutes and forgot the restart; the 15m window
    still holds it (as a 15m health window does), so its summary names the drift with it, never
    "with no restart or k change"."""
    restart = T0 + 3000

    def serve(t: float) -> bytes:
        if t < restart:
            return dump(PRO, 50 * (t - T0), (0.924, 0.687), T0)
        return dump(PRO, 50 * (t - restart), (0.80, 0.40), restart)

    got = same_causes_as_the_health_window(serve, restart + 905, "15m")
    assert got == [
        ("configuration_change", "every position lower together: AL 2.200 against 2.611 before a restart of engine 0 "
                                 "(the gain at 74.5 % of it): a drift that came with it")]


def test_the_1m_summary_reads_the_figures_before_a_restart_over_1m():
    """100 drafts/s at 74 % / 50 % (AL 2.240), then a restart (_created 5,000 s later) into 30 % / 8 %
    (AL 1.380). The 1m window before the restart held 60 s x 100 = 6,000 drafts (the 5m one
    30,000): the 1m summary says 6,000, as a 1m health window does."""
    restart = T0 + 5000

    def serve(t: float) -> bytes:
        if t < restart:
            return dump("my-model", 100 * (t - T0), HEALTHY, T0)
        return dump("my-model", 100 * (t - restart), WEAK, restart)

    got = same_causes_as_the_health_window(serve, restart + 305, "1m")
    assert got == [
        ("configuration_change", "the draft head changed at a restart of engine 0: position 0 accepted in 30.0 % of "
                                 "drafts since it, against 74.0 % of 6,000 drafts before it (AL 1.380 since it, against "
                                 "2.240 before it)"),
        ("draft_head_partial", "every engine (1) and every position low since a restart of engine 0: position 0 at "
                               "30.0 %, then 26.7 % conditional")]


# ---- from test_restart_causes.py
# Issue 31: restarts known from vLLM's _created name the right cause on every surface.
#
# - (item 2) A restart into a weaker head, no profile: before it 74 % at position 0 (500,000
#   drafts in diff's BEFORE dump), after it 30 %. Health never says "from the start" where the
#   restart is known, and names the cause with both figures: the draft head changed at it.
# - /api/v1/summary over any window keeps what the poller saw (restarts, k changes, the figures
#   before them): a window other than the health window names the same configuration change.
# - A younger twin behind the same URL (a new replica answering after a rollout, its _created
#   newer, its counters past the old one's) never makes a healthy model degraded.
#
# Every expected figure is worked by hand from the served counters.


# --- A restart into a weaker head, no profile ---
HEALTHY, WEAK = (0.74, 0.50), (0.30, 0.08)  # AL 2.240 and 1.380


def test_diff_across_a_restart_into_a_weaker_head_names_the_change_with_both_figures(tmp_path):
    """BEFORE: 500,000 drafts at 74 % / 50 %; AFTER: a process started an hour later at 30 % / 8 %,
    30,000 drafts (and, as a second case, 600,000: counters grown past BEFORE's). The interval is
    the new process's life; position 0 was healthy before the restart, so a fall (degraded),
    never "from the start"."""
    (tmp_path / "a.prom").write_bytes(dump("my-model", 500_000, HEALTHY, T0))
    for drafts in (30_000, 600_000):
        (tmp_path / "b.prom").write_bytes(dump("my-model", drafts, WEAK, T0 + 3600))
        out = json.loads(run_cli("diff", str(tmp_path / "a.prom"), str(tmp_path / "b.prom"), "--format", "json").stdout)
        model = out["models"]["my-model"]
        assert model["all"]["num_drafts"] == drafts
        assert model["health"] == {"state": "degraded", "reason": "position 0 acceptance 0.300 < 0.5: a broken draft "
                                                                  "path, or synthetic random-token load such as a benchmark",
                                   "engines": {"0": "ok"}}
        assert model["diagnosis"] == [
            {"cause": "configuration_change",
             "evidence": "the draft head changed at a restart of engine 0 between the dumps: position 0 accepted in "
                         "30.0 % of drafts since it, against 74.0 % of 500,000 drafts before it (AL 1.380 since it, "
                         "against 2.240 before it)"},
            {"cause": "draft_head_partial",
             "evidence": "every engine (1) and every position low since a restart of engine 0 between the dumps: "
                         "position 0 at 30.0 %, then 26.7 % conditional"}]  # 0.08 / 0.30
        text = run_cli("diff", str(tmp_path / "a.prom"), str(tmp_path / "b.prom")).stdout.decode()
        assert "< 0.5 from the start" not in text and "the draft head changed at a restart of engine 0" in text
    # report reads one dump: the new process's totals since its counters started, so "from the
    # start" is true there, and with no profile and nothing before, no cause is claimed.
    report = json.loads(run_cli("report", str(tmp_path / "b.prom"), "--format", "json").stdout)["models"]["my-model"]
    assert report["health"]["reason"].startswith("position 0 acceptance 0.300 < 0.5 from the start, with no profile")
    assert report["diagnosis"] == []


def test_the_sidecar_names_a_restart_into_a_weaker_head_with_both_figures():
    """100 drafts/s at 74 % / 50 % for 5,000 s, then a restart (_created 5,000 s later) into 30 % / 8 %.
    Before it the 5m health window held 30,000 drafts at 74.0 % (AL 2.240). Once the window is all
    new process (300 s on): degraded, the change named with both figures; later, with the restart
    out of the health window but within the hour the fall is read against, still the change, never
    a workload shift "with no restart"."""
    restart = T0 + 5000

    def serve(t: float) -> bytes:
        if t < restart:
            return dump("my-model", 100 * (t - T0), HEALTHY, T0)
        return dump("my-model", 100 * (t - restart), WEAK, restart)

    change = ("configuration_change", "the draft head changed at a restart of engine 0: position 0 accepted in 30.0 % "
                                      "of drafts since it, against 74.0 % of 30,000 drafts before it (AL 1.380 since "
                                      "it, against 2.240 before it)")
    partial = ("draft_head_partial", "every engine (1) and every position low since a restart of engine 0: position 0 "
                                     "at 30.0 %, then 26.7 % conditional")

    async def go():
        async with Sidecar(serve, T0 + 10) as s:
            await s.poll_until(restart + 305)
            mv = s.model()
            assert (mv.health, mv.health_reason) == ("degraded", "position 0 acceptance 0.300 < 0.5: a broken draft "
                                                                 "path, or synthetic random-token load such as a benchmark")
            assert [(h.cause, h.evidence) for h in mv.health_causes] == [change, partial]
            assert change[1] in await s.page()
            await s.poll_until(restart + 1800)
            mv = s.model()
            assert mv.health == "degraded" and "from the start" not in mv.health_reason
            assert [(h.cause, h.evidence) for h in mv.health_causes] == [change, partial]
            assert [d["cause"] for d in (await s.summary("5m"))["diagnosis"]] == ["configuration_change",
                                                                                 "draft_head_partial"]
    asyncio.run(go())


# --- /api/v1/summary over another window keeps what the poller saw ---

def test_the_summary_of_another_window_names_the_change_the_health_window_names():
    """Health window 1m. V4-Pro k=2 at 92.4 % / 68.7 % (AL 2.611), then a restart into k=3 with a
    broken head (3.6 % / 0.1 % / 0.0 %): the 1m verdict names the restart and k 2 -> 3; so must the
    summary over 5m and 15m (before, they were judged again without them: garbage alone)."""
    pro, restart = "deepseek-ai/DeepSeek-V4-Pro", T0 + 3000

    def serve(t: float) -> bytes:
        if t < restart:
            return dump(pro, 50 * (t - T0), (0.924, 0.687), T0)
        return dump(pro, 50 * (t - restart), (0.0357, 0.001, 0.0), restart)

    async def go():
        async with Sidecar(serve, T0 + 10, {"health": {"window": "1m"}}) as s:
            await s.poll_until(restart + 65)
            mv = s.model()
            assert mv.health == "collapsed"
            named = [(h.cause, h.evidence) for h in mv.health_causes]
            assert named[0] == ("configuration_change", "the draft head changed at a restart of engine 0, k 2 -> 3: "
                                                        "position 0 accepted in 3.6 % of drafts since it, against "
                                                        "92.4 % of 3,000 drafts before it")
            assert [c for c, _ in named] == ["configuration_change", "draft_head_garbage"]
            for window in ("1m", "5m", "15m"):
                got = (await s.summary(window))["diagnosis"]
                assert [d["cause"] for d in got] == ["configuration_change", "draft_head_garbage"], window
                assert "k 2 -> 3" in got[0]["evidence"], window
    asyncio.run(go())


# --- A younger twin behind the same URL ---
OLD_START, ROLLOUT = T0, T0 + 7200
# The old replica: 50 drafts/s per engine since T0 at 92.4 % / 68.7 % (AL 2.611). The new one,
# started 840 s before it answers, takes more traffic (500 drafts/s) at a healthy 85 % / 62 %
# (AL 2.470): at the rollout its counters (420,000) are past the old one's (360,000), so per-series
# differences would read one interval of 60,000 drafts at AL 1.62 instead of a restart.
REPLICAS = {"old": (OLD_START, 50.0, (0.924, 0.687)), "new": (ROLLOUT - 840, 500.0, (0.85, 0.62))}


def twin(which: str, t: float) -> bytes:
    started, rate, shares = REPLICAS[which]
    return dump("deepseek-ai/DeepSeek-V4-Pro", rate * (t - started), shares, started, engines=8)


def test_a_younger_twin_behind_the_url_never_makes_a_healthy_model_degraded():
    """At the rollout each engine's counters read 360,000 drafts (old) then 420,000 (new). Taken
    as one interval that is 60,000 drafts with 617,400 - 579,960 = 37,440 accepted: AL 1.62, and
    the 5m window fell to 1.82 < the V4-Pro k=2 threshold 1.953 (what the exporter said before it
    read _created). The new _created is a restart: the new replica's own counters count, at AL
    2.470; and the old one answering again in between (a rollout's two pods) is an older server,
    left out. Healthy at every poll, on every window."""
    for mode in ("switch", "alternate"):
        calls = {"n": 0}

        def serve(t: float, mode=mode, calls=calls) -> bytes:
            calls["n"] += 1
            if t < ROLLOUT or (mode == "alternate" and t < ROLLOUT + 120 and calls["n"] % 2 == 0):
                return twin("old", t)
            return twin("new", t)

        async def go(serve=serve, mode=mode):
            async with Sidecar(serve, ROLLOUT - 900) as s:
                states = []
                while s.clock.t < ROLLOUT + 600:
                    await s.app[POLLERS][0].poll_once()
                    if s.clock.t >= ROLLOUT - 600:  # once the 5m window is full
                        states.append((s.clock.t - ROLLOUT, s.model().health, s.model().health_reason))
                    s.clock.t += 5.0
                assert {st for _, st, _ in states} == {"ok"}, (mode, [x for x in states if x[1] != "ok"][:3])
                for window in ("1m", "5m", "15m"):
                    assert (await s.summary(window))["health"]["state"] == "ok", (mode, window)
                assert (await s.summary("1m"))["all"]["mean_acceptance_length"] == pytest.approx(1 + 0.85 + 0.62)
        asyncio.run(go())


# --- A restart of every engine that ends a fall ---

def test_the_fall_before_a_restart_that_ended_it_is_never_read_as_its_cause():
    """8 engines of V4-Pro k=2, 50 drafts/s each: healthy at 92.4 % / 68.7 % (AL 2.611), the head
    broken from COLLAPSE at 3.57 % / 0.1 % (AL 1.037; 10 minutes later the model is collapsed),
    then every engine restarts (_created RESTART) with a healthy head, or with the same broken
    one. While the windows still hold the fall before the restart, their verdict reads it, but
    the cause is read from the counters since the restart alone: a healthy head there names
    nothing (the mix of both heads once read as a workload shift, then a partly broken head); a
    head still broken names the garbage from its own figures: position 0 at 3.6 % (round(0.0357
    x 50 x 5 s) = 9 of 250 drafts per engine 5 s after the restart; at the restart itself, with no
    drafts since it yet, nothing). Never the restart (the model was down before it)."""
    collapse, restart = T0 + 1200, T0 + 1800
    healthy, broken = (0.924, 0.687), (0.0357, 0.001)

    def served(after: tuple[float, float]):
        def serve(t: float) -> bytes:
            if t >= restart:
                return dump(PRO, 50 * (t - restart), after, restart, engines=8)
            d1, d2 = 50 * (min(t, collapse) - T0), 50 * max(0.0, t - collapse)
            pos = [round(h * d1 + b * d2) for h, b in zip(healthy, broken, strict=True)]
            lines = []
            for e in range(8):
                lab = f'engine="{e}",model_name="{PRO}"'
                lines += [f"{V1}drafts_total{{{lab}}} {d1 + d2:.0f}", f"{V1}drafts_created{{{lab}}} {T0!r}",
                          f"{V1}draft_tokens_total{{{lab}}} {2 * (d1 + d2):.0f}",
                          f"{V1}accepted_tokens_total{{{lab}}} {sum(pos)}"]
                lines += [f'{V1}accepted_tokens_per_pos_total{{{lab},position="{i}"}} {v}' for i, v in enumerate(pos)]
            return ("\n".join(lines) + "\n").encode()
        return serve

    async def go(after: tuple[float, float]) -> list[tuple[float, str, tuple[str, ...]]]:
        seen = []
        async with Sidecar(served(after), T0 + 10) as s:
            await s.poll_until(restart)
            assert (s.model().health, [h.cause for h in s.model().health_causes]) == ("collapsed", ["draft_head_garbage"])
            while s.clock.t < restart + 300:  # the 5m health window holds the fall until then
                await s.poll_until(s.clock.t + 1)
                mv, at = s.model(), s.clock.t - 5 - restart  # poll_until steps the clock past the poll
                causes = tuple(h.cause for h in mv.health_causes)
                seen.append((at, mv.health, causes))
                assert await metrics_causes(s) == set(causes), at
                for window in ("1m", "5m", "15m"):
                    got = tuple(d["cause"] for d in (await s.summary(window))["diagnosis"])
                    assert got == causes, (at, window, got, causes)
                if after == broken and at == 5:
                    assert [h.evidence for h in mv.health_causes] == ["position 0 accepted in 3.6 % of drafts, on every engine"]
        return seen

    fixed = asyncio.run(go(healthy))
    assert fixed[0][0] == 0 and fixed[-1][0] == 295 and {state for _, state, _ in fixed} >= {"collapsed", "degraded"}
    assert all(causes == () for _, _, causes in fixed), [x for x in fixed if x[2]][:3]
    still = asyncio.run(go(broken))
    # The poll at the restart itself: no drafts since it yet, so nothing to name (not the fall before it).
    assert still[0] == (0, "collapsed", ())
    assert all((state, causes) == ("collapsed", ("draft_head_garbage",)) for _, state, causes in still[1:]), still[:3]


def test_position_0_was_healthy_at_its_floor_over_enough_drafts_with_a_position_counter():
    """One definition, read by the sidecar's day of memory and by diff's BEFORE dump across a restart."""
    def pos0(drafts: float, first: float, k: int = 2) -> Counters:
        return Counters(drafts, k * drafts, first, (first, 0.0)[:k])

    assert position0_healthy(pos0(100, 50), DETECTION, 100)  # at the floor (0.5), at min_drafts
    assert not position0_healthy(pos0(100, 49), DETECTION, 100)  # under the floor
    assert not position0_healthy(pos0(99, 99), DETECTION, 100)  # too few drafts to say
    assert not position0_healthy(pos0(100, 100, k=0), DETECTION, 100)  # no per-position counter
    assert not position0_healthy(pos0(0, 0), DETECTION, 0)  # no drafts at all, min_drafts 0
