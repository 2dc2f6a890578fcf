"""Windows over the history: reset-aware, k changes, bounded memory."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from vllm_specdec_exporter import config
from vllm_specdec_exporter.history import TargetHistory
from vllm_specdec_exporter.model import Counters

WINDOWS = (("1m", 60.0), ("5m", 300.0), ("15m", 900.0), ("1h", 3600.0))
KEY = ("m", "0")


def c(drafts, k=2, accepted_per_draft=1.5):
    pos = (drafts * 0.9, drafts * 0.6) if k == 2 else tuple(drafts * 0.5 for _ in range(k))
    return Counters(drafts, drafts * k, sum(pos), pos)


def test_window_is_a_difference_of_running_totals_across_restarts():
    h = TargetHistory(WINDOWS, 4000)
    h.observe(0, {KEY: c(1000)})  # before we watched: not counted
    h.observe(10, {KEY: c(1100)})
    obs = h.observe(20, {KEY: c(50)})  # a restart, confirmed by the next poll
    assert obs.restarted == () and KEY not in obs.increments
    obs = h.observe(30, {KEY: c(150)})
    assert obs.restarted == (KEY,) and obs.increments[KEY].drafts == 150  # everything since the restart
    w = h.window("1m")
    assert w.span_seconds == 30
    assert w.engines[KEY].drafts == 100 + 50 + 100


def test_k_change_across_a_restart_starts_a_new_total():
    h = TargetHistory(WINDOWS, 4000)
    h.observe(0, {KEY: c(1000)})
    h.observe(10, {KEY: c(1100)})
    h.observe(20, {KEY: c(40, k=3)})
    obs = h.observe(30, {KEY: c(90, k=3)})
    assert obs.restarted == (KEY,)
    w = h.window("1m")
    assert w.engines[KEY].k == 3 and w.engines[KEY].drafts == 90


def test_window_start_is_within_a_sixtieth_of_the_window():
    h = TargetHistory(WINDOWS, 4000)
    for t in range(0, 7201):
        h.observe(float(t), {KEY: c(10.0 * t)})
    for label, seconds in WINDOWS:
        w = h.window(label)
        assert seconds <= w.span_seconds <= seconds * (1 + 1 / config.WINDOW_RESOLUTION) + 1
        assert w.engines[KEY].drafts == pytest.approx(10 * w.span_seconds)


@pytest.mark.long
def test_memory_is_bounded_whatever_the_uptime():
    h = TargetHistory(WINDOWS, 4000)
    bound = len(WINDOWS) * (config.WINDOW_RESOLUTION + 2)
    largest = 0
    for t in range(0, 86400, 1):  # a day at a 1 s poll
        h.observe(float(t), {KEY: c(10.0 * t)})
        if t % 97 == 0:
            largest = max(largest, h.sample_count())
    assert largest <= bound


def test_engines_unseen_for_long_are_forgotten():
    h = TargetHistory(WINDOWS, forget_after=100)
    h.observe(0, {KEY: c(10), ("m", "1"): c(10)})
    h.observe(50, {KEY: c(20)})
    h.observe(200, {KEY: c(30)})
    assert set(h.latest.totals) == {KEY}


def test_an_engine_that_returns_after_being_forgotten_does_not_add_its_lifetime():
    h = TargetHistory(WINDOWS, forget_after=100)
    other = ("m", "1")
    h.observe(0, {KEY: c(1000), other: c(500)})
    for t in range(10, 300, 10):  # engine 1 vanishes long enough to be forgotten
        h.observe(float(t), {KEY: c(1000 + 10 * t)})
    h.observe(300, {KEY: c(4000), other: c(900_000)})  # back, with its lifetime count
    obs = h.observe(310, {KEY: c(4100), other: c(900_100)})
    assert obs.increments[other].drafts == 100
    w = h.window("1m")
    assert w.engines[other].drafts == 100  # not 900,100
    assert w.engines[KEY].drafts == 4100 - c(3500).drafts


@pytest.mark.parametrize("how", ["unseen", "cap"])
def test_a_window_longer_than_an_engines_absence_counts_all_it_did_since_it_returned(how):
    """helper-39: the window's first sample still held the engine's old running total; back as a fresh
    vLLM, its new total from 0 read as a restart until it passed the old one, then the old one was
    subtracted: 2,000 drafts a poll read 200. Forgotten for being unseen, or by the cap's forget."""
    h = TargetHistory([("1h", 3600.0)], forget_after=600 if how == "unseen" else 4000)
    other, t, drafts = ("m", "1"), 0.0, 0.0
    for _ in range(800):  # watched longer than the window: the window starts at a total of its
        t, drafts = t + 5, drafts + 200
        h.observe(t, {KEY: c(1e5 + drafts), other: c(t)})
    for i in range(130 if how == "unseen" else 2):  # gone: past forget_after, or forgotten by the cap at once
        t += 5
        h.observe(t, {other: c(t)}, forget=[KEY] if how == "cap" and i == 0 else ())
    assert KEY not in h.seen()
    back = 0.0
    for i in range(40):  # a fresh vLLM: 2,000 a poll, from 0
        t, back = t + 5, back + 2000
        h.observe(t, {KEY: c(back), other: c(t)})
        assert h.window("1h").engines[KEY].drafts == back - 2000, (i, back)  # all since its first poll back


def test_a_new_engine_counts_from_its_first_poll():
    h = TargetHistory(WINDOWS, 4000)
    h.observe(0, {KEY: c(100)})
    obs = h.observe(10, {KEY: c(200), ("m", "1"): c(50)})
    assert obs.appeared == (("m", "1"),) and ("m", "1") not in obs.increments
    h.observe(20, {KEY: c(300), ("m", "1"): c(80)})
    assert h.window("1m").engines[("m", "1")].drafts == 30


# --- glitches are not restarts (issue 10 item 2) ---

LIFE = 10_000_000  # drafts of a long healthy life (AL 2.6 at k=2)


def life(extra_drafts: float, al_extra: float = 0.03) -> Counters:
    """10 M healthy drafts (per position 0.9, 0.7), then ``extra_drafts`` collapsed ones."""
    p0, p1 = LIFE * 0.9 + extra_drafts * al_extra, LIFE * 0.7
    return Counters(LIFE + extra_drafts, 2 * (LIFE + extra_drafts), p0 + p1, (p0, p1))


def al(w) -> float:
    d = w.engines[KEY]
    return 1 + d.accepted / d.drafts


def run(glitch: Callable[[Counters], Counters], at: int = 30) -> TargetHistory:
    h = TargetHistory(WINDOWS, 4000)
    for i in range(60):
        now = life(500.0 * i)
        h.observe(5.0 * i, {KEY: glitch(now) if i == at else now})
    return h


def dip_one_position(c: Counters) -> Counters:  # 1 below the previous poll (+15 per poll)
    return replace(c, per_position=(c.per_position[0] - 16, c.per_position[1]))


def cut_between_positions(c: Counters) -> Counters:
    return replace(c, per_position=c.per_position[:1])


def k_grows(c: Counters) -> Counters:
    return replace(c, per_position=(*c.per_position, 12345.0))


def other_server_below(c: Counters) -> Counters:  # a second replica behind the URL, younger
    return Counters(3_000_000, 6_000_000, 4_800_000, (2_700_000, 2_100_000))


def other_server_above(c: Counters) -> Counters:  # ... or older
    return Counters(14_000_000, 28_000_000, 22_400_000, (12_600_000, 9_800_000))


def fresh_server(c: Counters) -> Counters:  # ... or just started: looks like a restart
    return Counters(200, 400, 320, (180, 140))


@pytest.mark.parametrize("glitch", [dip_one_position, cut_between_positions, k_grows, other_server_below,
                                    other_server_above, fresh_server])
def test_one_glitchy_poll_adds_nothing_to_any_window(glitch):
    h = run(glitch)
    for label, _ in WINDOWS:
        assert al(h.window(label)) == pytest.approx(1.03, abs=1e-9), label


@pytest.mark.parametrize("glitch", [other_server_below, other_server_above, fresh_server])
def test_two_alternating_servers_never_add_one_lifetime_to_the_other(glitch):
    h = TargetHistory(WINDOWS, 4000)
    seen = []
    for i in range(60):
        now = life(500.0 * i)
        obs = h.observe(5.0 * i, {KEY: glitch(now) if i % 2 else now})
        seen += [reason for _, reason in obs.inconsistent]
    assert seen  # counted
    assert al(h.window("1h")) == pytest.approx(1.03, abs=0.01)


def test_a_glitch_is_reported_once_and_the_next_poll_counts_from_the_base():
    h = TargetHistory(WINDOWS, 4000)
    h.observe(0, {KEY: life(0)})
    h.observe(5, {KEY: life(500)})
    obs = h.observe(10, {KEY: dip_one_position(life(1000))})
    assert obs.inconsistent == ((KEY, "only some counters went down"),) and KEY not in obs.increments
    obs = h.observe(15, {KEY: life(1500)})
    assert obs.inconsistent == () and obs.increments[KEY].drafts == 1000  # from the base: nothing lost
    assert h.window("1m").engines[KEY].drafts == 1500


def test_every_total_a_draft_below_in_a_lull_is_no_restart_without_a_start_time():
    """helper-39 (no _created: multiprocess mode): collapsed for 5 minutes, then idle, every total one
    below the last poll and staying there. Read as a restart (a drop to under the drafts a restart could
    make), the next poll confirmed it and the whole healthy life (10 M drafts at AL 2.6) entered every
    window: the collapse read healthy. A restart starts from zero: at most half the base's drafts."""
    def short_life(extra: float) -> Counters:  # life()'s with 1 M healthy drafts: under a restart's 1.25 M at 5 s
        p0, p1 = 0.9e6 + extra * 0.03, 0.7e6
        return Counters(1e6 + extra, 2 * (1e6 + extra), p0 + p1, (p0, p1))

    h = TargetHistory(WINDOWS, 4000)
    for i in range(60):
        h.observe(5.0 * i, {KEY: short_life(500.0 * i)})
    last = short_life(500.0 * 59)
    dipped = Counters(last.drafts - 1, last.draft_tokens - 2, last.accepted - 1, (last.per_position[0] - 1, last.per_position[1]))
    reasons = []
    for i in range(60, 66):  # idle: the dipped totals, poll after poll
        obs = h.observe(5.0 * i, {KEY: dipped})
        assert obs.restarted == () and (KEY not in obs.increments or obs.increments[KEY].drafts == 0), i
        reasons += [r for _, r in obs.inconsistent]
    assert reasons[:1] == ["counters went down a little, not to near zero (a glitch?)"]
    assert al(h.window("1h")) == pytest.approx(1.03, abs=1e-9)
    # A restart to under half the base is still one (confirmed by the next poll, counted whole).
    h.observe(5.0 * 66, {KEY: Counters(400, 800, 620, (360, 260))})
    obs = h.observe(5.0 * 67, {KEY: Counters(900, 1800, 1395, (810, 585))})
    assert obs.restarted == (KEY,) and obs.increments[KEY].drafts == 900


def test_two_inconsistent_polls_in_a_row_re_base():
    h = TargetHistory(WINDOWS, 4000)
    h.observe(0, {KEY: life(0)})
    h.observe(5, {KEY: life(500)})
    h.observe(10, {KEY: cut_between_positions(life(1000))})  # k 2 -> 1, no restart
    obs = h.observe(15, {KEY: cut_between_positions(life(1500))})  # still k=1: the new base
    assert [r for _, r in obs.inconsistent] == ["k changed without a restart (positions cut off or added)"]
    obs = h.observe(20, {KEY: cut_between_positions(life(2000))})
    assert obs.increments[KEY].drafts == 500 and obs.increments[KEY].k == 1
    # k changed: as across a restart, the window holds what came after the re-base
    assert h.window("1m").engines[KEY].drafts == 500


def test_a_real_restart_with_a_new_k_is_counted_from_zero():
    h = TargetHistory(WINDOWS, 4000)
    h.observe(0, {KEY: life(0)})
    h.observe(5, {KEY: life(500)})
    h.observe(10, {KEY: c(300, k=3)})
    obs = h.observe(15, {KEY: c(800, k=3)})
    assert obs.restarted == (KEY,) and obs.increments[KEY].drafts == 800
    w = h.window("1m")
    assert w.engines[KEY].k == 3 and w.engines[KEY].drafts == 800


def test_the_cap_forgets_the_engine_unseen_longest_and_refuses_when_all_are_served():
    h = TargetHistory(WINDOWS, 4000)
    e = [("m", str(i)) for i in range(10)]
    kept, refused, forget = h.admit({k: c(10) for k in e[:5]}, cap=3, max_models=64)
    assert sorted(kept) == e[:3] and refused == 2 and forget == []  # all 3 held are served: refused
    h.observe(0, kept)
    h.observe(5, {e[0]: c(20), e[1]: c(20)})
    h.observe(10, {e[0]: c(30)})  # engine 2 unseen since t=0, engine 1 since t=5
    kept, refused, forget = h.admit({e[0]: c(40), e[8]: c(5)}, cap=3, max_models=64)
    assert forget == [e[2]] and sorted(kept) == [e[0], e[8]] and refused == 0
    h.observe(15, kept, forget)
    assert h.held() == 3 and set(h.latest.totals) == {e[0], e[1], e[8]}
    kept, refused, _ = h.admit({e[0]: c(50), ("x", "0"): c(1)}, cap=10, max_models=1)
    assert list(kept) == [e[0]] and refused == 1  # a second model in one poll, over max_models


def test_lazy_position_series_appearing_is_growth_not_a_glitch():
    """llama.cpp (and vLLM's Rust frontend) create the per-position series with the
    first speculative step: k=0 with nothing drafted, then k=3. The first step's
    drafts count in every window, with no inconsistent poll and no restart."""
    h = TargetHistory(WINDOWS, 4000)
    empty = Counters(0, 0, 0, (), 420)
    h.observe(0, {KEY: empty})
    obs = h.observe(5, {KEY: empty})
    assert obs.inconsistent == () and obs.increments[KEY].drafts == 0
    first = Counters(100, 300, 180, (80, 60, 40), 700)
    obs = h.observe(10, {KEY: first})
    assert obs.inconsistent == () and obs.restarted == ()
    assert obs.increments[KEY] == Counters(100, 300, 180, (80, 60, 40), 280)
    obs = h.observe(15, {KEY: Counters(150, 440, 240, (115, 75, 50), 800)})
    assert obs.inconsistent == () and obs.increments[KEY].drafts == 50
    for label, _ in WINDOWS:
        w = h.window(label).engines[KEY]
        # Worked by hand: 150 drafts, 240 accepted (AL 2.6), 800 - 420 generation tokens.
        assert (w.drafts, w.draft_tokens, w.accepted, w.per_position, w.generation_tokens) == (
            150, 440, 240, (115, 75, 50), 380)


def test_positions_appearing_after_drafts_were_counted_is_still_inconsistent():
    """Only an engine with nothing drafted may grow its k: positions appearing on an
    engine that already drafted are a cut or a second server, never counted."""
    h = TargetHistory(WINDOWS, 4000)
    h.observe(0, {KEY: Counters(100, 200, 0, ())})
    h.observe(5, {KEY: Counters(110, 220, 0, ())})
    obs = h.observe(10, {KEY: Counters(120, 240, 100, (70, 30))})
    assert obs.inconsistent and KEY not in obs.increments


def test_an_engine_at_the_readmes_fastest_rate_is_consistent():
    """Issue 19 item 7: 1,024 sequences at 100 steps/s is 102,400 drafts/s, which the old
    100,000 ceiling called inconsistent on 119 of 120 polls (health idle during a
    collapse). It and 2x it are plain growth now; 2x the ceiling is still refused."""
    for per_second in (102_400, 204_800):
        h = TargetHistory(WINDOWS, 4000)
        seen = []
        for i in range(120):
            seen += h.observe(5.0 * i, {KEY: c(per_second * 5.0 * i)}).inconsistent
        assert seen == [], per_second
        assert h.window("1m").engines[KEY].drafts == pytest.approx(per_second * 60)
    h = TargetHistory(WINDOWS, 4000)
    h.observe(0, {KEY: c(0)})
    obs = h.observe(5, {KEY: c(config.MAX_DRAFTS_PER_SECOND * 10.0)})
    assert [r for _, r in obs.inconsistent] == ["drafts grew faster than any engine can (another server's values?)"]


def test_a_model_with_thousands_of_engine_labels_cannot_take_every_slot():
    """Issue 19 item 9: new engines were admitted in label order, so a model whose labels
    sort first (a hostile or broken producer's 5,000 engines) took every slot on the first
    poll and the real model was refused. New engines are now taken in turn by model."""
    h = TargetHistory(WINDOWS, 4000)
    flood = {("a-noise", str(i)): c(10) for i in range(5000)}
    real = {("deepseek-ai/DeepSeek-V4-Pro", str(i)): c(10) for i in range(8)}
    kept, refused, _ = h.admit({**flood, **real}, cap=50, max_models=64)
    assert set(real) <= set(kept) and len(kept) == 50 and refused == 5008 - 50


def test_two_replicas_of_the_same_age_behind_one_url_are_inconsistent_every_other_poll():
    """Issue 19 item 9: two replicas behind one Service, close in age, read as one engine.
    Every other poll is inconsistent -- the share VLLMSpecDecodeTargetInconsistent pages on
    (config.TARGET_INCONSISTENT_SHARE) -- and neither adds the other's lifetime."""
    for lead in (-3000.0, 3000.0):  # the second replica just behind, or just ahead
        h = TargetHistory(WINDOWS, 4000)
        bad = 0
        for i in range(60):
            drafts = LIFE + 500.0 * i + (lead if i % 2 else 0.0)
            bad += len(h.observe(5.0 * i, {KEY: c(drafts)}).inconsistent)
        assert bad >= config.TARGET_INCONSISTENT_SHARE * 59, (lead, bad)
        assert h.window("1m").engines[KEY].drafts <= 500 * 12 + abs(lead)  # no lifetime added


def test_one_cut_poll_does_not_evict_held_engines_for_the_new_engines_in_it():
    """Issue 29 item 8: a poll cut before the real engines' lines, with new (hostile)
    engines filling max_series_per_target, evicted the held engines, and the next normal
    poll refused them for good: the newcomers held every slot. A held engine gives up its
    place only when missing from two polls in a row."""
    cap = 3
    h = TargetHistory(WINDOWS, 4000)
    real = [("m", str(i)) for i in range(cap)]
    hostile = {("evil", str(i)): c(1) for i in range(10)}
    for t in (0, 5):
        kept, refused, forget = h.admit({k: c(10 + t) for k in real}, cap=cap, max_models=64)
        h.observe(t, kept, forget)
    # The cut poll: none of the real engines, ten new ones.
    kept, refused, forget = h.admit(hostile, cap=cap, max_models=64)
    assert (kept, refused, forget) == ({}, 10, [])
    h.observe(10, kept, forget)
    # The next normal poll keeps all of them, counting on.
    kept, refused, forget = h.admit({k: c(20) for k in real}, cap=cap, max_models=64)
    assert sorted(kept) == real and refused == 0 and forget == []
    obs = h.observe(15, kept, forget)
    assert sorted(obs.increments) == real and obs.appeared == ()

    # Cut with some of the real engines in it: the missing one is kept too.
    kept, refused, forget = h.admit({real[0]: c(25), **hostile}, cap=cap, max_models=64)
    assert list(kept) == [real[0]] and forget == [] and refused == 10
    h.observe(20, kept, forget)
    # Missing from a second poll in a row (the last poll that saw a held engine): replaced,
    # the one unseen the longest first.
    kept, refused, forget = h.admit({real[0]: c(30), **hostile}, cap=cap, max_models=64)
    assert sorted(forget) == real[1:] and len(kept) == cap and refused == 10 - (cap - 1)


def test_engines_all_relabelled_at_the_cap_take_over_on_the_second_poll_not_after_forget_after():
    """The cut-poll rule (a held engine gives up its place only when missing from two polls
    in a row) must not stall a whole relabel: every held engine missing, twice, is replaced."""
    h = TargetHistory([("1m", 60.0)], 3600.0)
    old, new = [("m", str(i)) for i in range(3)], [("n", str(i)) for i in range(3)]
    h.observe(0.0, {k: c(10) for k in old})
    kept, refused, forget = h.admit({k: c(1) for k in new}, cap=3, max_models=64)
    assert (kept, refused, forget) == ({}, 3, [])  # one odd poll changes nothing
    h.observe(5.0, {})
    kept, refused, forget = h.admit({k: c(1) for k in new}, cap=3, max_models=64)
    assert sorted(kept) == new and refused == 0 and sorted(forget) == old  # the second in a row does


def test_a_restart_known_from_the_start_time_counts_from_it():
    """Issue 31: a process started since (vLLM's _created) counts from its start. With its counters
    below the last poll's, at once; grown past them, once the next poll keeps that start time
    (helper-28: a start time that moves at every poll otherwise read as a restart each time), with
    the whole new count."""
    h = TargetHistory([("1m", 60.0)], 3600.0)
    key = ("m", "0")
    h.observe(0.0, {key: replace(c(1000), started=1.7e9)})
    h.observe(5.0, {key: replace(c(1100), started=1.7e9)})
    got = h.observe(10.0, {key: replace(c(50), started=1.7e9 + 8)})  # below: at once
    assert list(got.restarted) == [key] and got.increments[key].drafts == 50 and not got.inconsistent
    got = h.observe(15.0, {key: replace(c(1500), started=1.7e9 + 14)})  # grown past: the next poll decides
    assert not got.restarted and key not in got.increments and not got.inconsistent
    got = h.observe(20.0, {key: replace(c(1600), started=1.7e9 + 14)})
    assert list(got.restarted) == [key] and not got.inconsistent
    assert got.increments[key].drafts == 1600  # everything since that start, not 100
    got = h.observe(25.0, {key: replace(c(1200), started=1.7e9 + 8)})  # the process before answers again
    # Two servers behind one URL: said, and what the old one drafted since it was last counted added.
    assert got.increments[key].drafts == 1150 and got.inconsistent[0][1].startswith("a server seen before answers")
    got = h.observe(30.0, {key: replace(c(1000), started=1.7e9 - 50)})  # one never counted, started earlier
    assert got.increments == {} and got.inconsistent[0][1].startswith("an engine that started earlier")


def test_a_start_time_that_creeps_forward_by_microseconds_is_the_same_start():
    """Found attacking the sidecar: 10 M lifetime drafts at AL 2.6, the head collapsed since (2,000
    drafts a second at AL 1.03), its _created 1 us later at every poll. Each poll read as a restart
    added the whole life to the windows (5m AL 2.598, health ok). Less than
    START_TIME_SLACK_SECONDS apart is the same start: each poll adds what it drafted, the collapse shows."""
    h = TargetHistory([("1m", 60.0)], 3600.0)
    life = lambda n: Counters(1e7 + 2000 * n, 2 * (1e7 + 2000 * n), 1.6e7 + 60 * n, (0.96e7 + 36 * n, 0.64e7 + 24 * n),
                              started=1.7e9 + n * 1e-6)
    h.observe(0.0, {KEY: life(0)})
    for n in range(1, 8):
        got = h.observe(float(n), {KEY: life(n)})
        assert not got.restarted and not got.inconsistent and got.increments[KEY].drafts == pytest.approx(2000), (n, got)
    w = h.window("1m").engines[KEY]
    assert 1 + w.accepted / w.drafts == pytest.approx(1.03)


@pytest.mark.parametrize("moved", [5.0, 0.5 + 1.0])  # stamped at each 5 s scrape; a jitter of over a second
def test_a_start_time_that_moves_at_every_poll_never_adds_the_engines_life(moved):
    """helper-28: 100,000 lifetime drafts at 100 a second, _created later at every poll (a relay
    stamping it, or jitter beyond the slack): 1 M drafts read in 1m as each poll "restarted". Now
    nothing is added and every poll after the first is inconsistent (TargetInconsistent's share is 0.4)."""
    h = TargetHistory([("1m", 60.0)], 3600.0)
    life = lambda n: replace(c(100_000 + 500 * n), started=1.7e9 + n * moved)
    h.observe(0.0, {KEY: life(0)})
    said = []
    for n in range(1, 13):
        got = h.observe(5.0 * n, {KEY: life(n)})
        assert not got.restarted and KEY not in got.increments, (n, got)
        said += [why for _, why in got.inconsistent]
    assert len(said) == 11 and all(why.startswith("a later start time (_created) at each poll") for why in said), said


def test_two_restarts_in_a_row_the_second_kept_counts_from_it():
    """helper-31 (hypothesis): a process started at +2 ahead of the base, then one started at +7 ahead
    of it, kept by the next polls. The first was never kept (lost, said); the second was read as plain
    growth from its own first reading, its 3,000 drafts never counted. Now it waits for its poll."""
    h = TargetHistory([("1h", 3600.0)], 4000.0)
    polls = [(1000, -100.0), (2000, 2.0), (3000, 7.0), (3100, 7.0), (3200, 7.0)]
    got = [h.observe(5.0 * i, {KEY: _life(d, s)}) for i, (d, s) in enumerate(polls)]
    assert [bool(o.restarted) for o in got] == [False, False, False, True, False]
    assert got[2].inconsistent and not got[3].inconsistent
    assert h.window("1h").engines[KEY].drafts == 3000 + 100 + 100


def test_a_rollouts_old_and_new_replicas_alternating_in_pairs_are_each_counted_once():
    """Issue 31: behind one URL the old replica (started at 1000) and the new one (started at 5000,
    its counters 4,000 drafts when it first answers) alternate two polls each. Each poll of a
    replica adds what it drafted since its own last poll counted, and the new one's 4,000 once
    (the restart that brought it): never its whole life again on each return (that added
    4,000-odd drafts per switch). Each replica drafts 100 a poll, counted or not."""
    h = TargetHistory(WINDOWS, 4000)
    old = lambda n: replace(c(10_000 + 100 * n), started=1000.0)
    new = lambda n: replace(c(4_000 + 100 * n), started=5000.0)
    counted = []
    for i in range(16):
        which = new if i >= 2 and (i // 2) % 2 == 1 else old
        obs = h.observe(5.0 * i, {KEY: which(i)})
        counted.append(obs.increments[KEY].drafts if KEY in obs.increments else 0)
    # polls 0-1 old (the first is not an increment), 2-3 new, 4-5 old, ... 14-15 new.
    # Old at poll 1: +100. New at 2: its life, 4,200 (a restart), at 3: +100. Old back at 4: +300
    # (its polls 2 and 3 drafted too), at 5: +100. New back at 6: +300, at 7: +100; and so on.
    assert counted == [0, 100, 4_200, 100, 300, 100, 300, 100, 300, 100, 300, 100, 300, 100, 300, 100]
    assert h.window("1h").engines[KEY].drafts == sum(counted)


def _life(drafts: float, started: float, gen: float | None = None) -> Counters:
    return replace(c(drafts), generation_tokens=gen, started=started)


def test_two_servers_alternating_the_newer_ahead_are_both_counted():
    """helper-30: A (started at 1000, 1,000 drafts) and B (started at 5000, 50,000, so ahead of A)
    answer in turn, each drafting 100 a poll. B's later start time with more drafts waited for a
    poll that kept it, and A's took it back each time: B was never counted (800 drafts in the window).
    A start time taken back and answering again is a restart then: B's life once (50,300 at its
    second answer), then 200 for each return of either, and A's 200 at poll 2."""
    h = TargetHistory([("1h", 3600.0)], 4000.0)
    for i in range(10):
        h.observe(5.0 * i, {KEY: _life(1000 + 100 * i, 1000.0) if i % 2 == 0 else _life(50_000 + 100 * i, 5000.0)})
    assert h.window("1h").engines[KEY].drafts == 200 + 50_300 + 6 * 200


def test_a_restart_that_grew_past_then_glitched_is_counted_from_its_start():
    """helper-30: the poll after a later start time keeps it but its counters went down (a glitch):
    the restart is kept (1,500 since it), the glitch judged against it (said, then 200 and 100)."""
    h = TargetHistory([("1h", 3600.0)], 4000.0)
    polls = [(1000, 1000.0), (1100, 1000.0), (1500, 2000.0), (1200, 2000.0), (1700, 2000.0), (1800, 2000.0)]
    said = []
    for i, (drafts, started) in enumerate(polls):
        got = h.observe(5.0 * i, {KEY: _life(drafts, started)})
        said += [why for _, why in got.inconsistent]
        assert bool(got.restarted) == (i == 3), (i, got)
    assert h.window("1h").engines[KEY].drafts == 100 + 1500 + 200 + 100
    assert len(said) == 1 and "did not restart" in said[0], said


def test_a_start_time_that_moves_at_every_poll_counts_nothing_beside_the_counters():
    """helper-30: the counters added nothing, but the generation tokens were counted on every other
    poll (30,000 against 0 drafts: a draft-token share diluted)."""
    h = TargetHistory([("1h", 3600.0)], 4000.0)
    for n in range(8):
        h.observe(5.0 * n, {KEY: _life(100_000 + 500 * n, 1.7e9 + 5 * n, gen=1e6 + 5000 * n)})
    w = h.window("1h").engines[KEY]
    assert w.drafts == 0 and not w.generation_tokens, w


def test_a_process_seen_before_is_known_within_the_start_time_slack():
    """helper-30: two replicas alternating in pairs, their _created jittering by a few ms: each
    return of the one behind added its whole life again (7,700 drafts against 3,800 without)."""
    jitter = [0.0, 0.003, 0.001, 0.002, 0.004, 0.0005]

    def drafted(with_jitter: bool) -> float:
        h = TargetHistory([("1h", 3600.0)], 4000.0)
        for i in range(16):
            j = jitter[i % 6] if with_jitter else 0.0
            behind = (i // 2) % 2 == 1
            h.observe(5.0 * i, {KEY: _life(1000 + 100 * i, 5000.0 + j) if behind else _life(50_000 + 100 * i, 1000.0 + j)})
        return h.window("1h").engines[KEY].drafts

    assert drafted(True) == drafted(False) == 3800


def test_a_start_time_below_the_one_waiting_to_be_kept_is_a_restart_at_once():
    """helper-31's model, rerun on reading the change again: starts at -10, +2, +7, +12 with 0, 2,
    2 and 1 drafts. The last is below the reading waiting to be kept (2 at +7): a restart at once,
    its 1 draft counted. It was judged against the base (0 drafts), called a moving start, lost."""
    h = TargetHistory([("1h", 3600.0)], 4000.0)
    got = [h.observe(5.0 * i, {KEY: _life(d, 1.7e9 + s)}) for i, (d, s) in enumerate([(0, -10), (2, 2), (2, 7), (1, 12)])]
    assert [bool(o.restarted) for o in got] == [False, False, False, True]
    assert h.window("1h").engines[KEY].drafts == 1
