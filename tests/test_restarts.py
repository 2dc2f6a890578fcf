"""Two readings of one engine (restarts.py): what accrued between them, and whether it restarted,
against hand-computed values."""

from __future__ import annotations

from vllm_specdec_exporter.model import Counters, RequestHistogram
from vllm_specdec_exporter.restarts import STARTED_AGAIN, classify, delta, delta_engines


def test_delta_plain():
    before = Counters(100, 200, 150, (90, 60), 400)
    after = Counters(160, 320, 200, (120, 80), 600)
    d, reset = delta(before, after)
    assert not reset
    assert d == Counters(60, 120, 50, (30, 20), 200)


def test_delta_reset_counts_the_new_values_for_the_whole_engine():
    before = Counters(1000, 2000, 1500, (900, 600))
    # Restarted, then climbed: position 1 (700) is already above its old value (600),
    # a per-series difference would give 100 instead of 700.
    after = Counters(800, 1600, 1300, (600, 700))
    d, reset = delta(before, after)
    assert reset
    assert d == after


def test_delta_k_change_is_a_restart():
    d, reset = delta(Counters(10, 20, 10, (6, 4)), Counters(50, 150, 60, (30, 20, 10)))
    assert reset and d.k == 3


def test_delta_engines_names_appearing_vanishing_and_restarting():
    key = lambda e: ("m", e)

    before = {key("0"): Counters(10, 10, 5, (5,)), key("1"): Counters(10, 10, 5, (5,)), key("2"): Counters(9, 9, 9, (9,))}
    after = {key("0"): Counters(20, 20, 10, (10,)), key("1"): Counters(4, 4, 2, (2,)), key("3"): Counters(3, 3, 1, (1,))}
    out = delta_engines(before, after, lambda k: f"engine {k[1]}")
    assert out.counters == {
        key("0"): Counters(10, 10, 5, (5,)),
        key("1"): Counters(4, 4, 2, (2,)),
        key("3"): Counters(3, 3, 1, (1,)),
    }
    assert out.restarted == (key("1"),)
    text = "\n".join(out.warnings)
    assert "engine 1: counters went down" in text
    assert "engine 3: not in the first scrape" in text
    assert "engine 2: in the first scrape only" in text


def test_only_generation_or_histogram_going_down_is_not_a_restart():
    """Issue 19 item 1: a restart is told by the spec-decode counters alone; a side series
    that went down (a cut scrape, a glitch) is undefined over the interval, never a reason
    to count the engine's whole lifetime."""
    before = Counters(1000, 2000, 1500, (900, 600), 5000, RequestHistogram((0.5,), (40,), 100))
    after = Counters(1100, 2200, 1650, (990, 660), 4000, RequestHistogram((0.5,), (30,), 110))
    d, restarted = delta(before, after)
    assert not restarted
    assert (d.drafts, d.accepted, d.per_position) == (100, 150, (90, 60))
    assert d.generation_tokens is None and d.request_acceptance is None


# --- Issue 31: the engine's start time (vLLM's _created) decides restarts where it is known ---


def _c(drafts: float, started: float | None, k: int = 2) -> Counters:
    return Counters(drafts, k * drafts, 1.2 * drafts, tuple(0.9 * drafts / (i + 1) for i in range(k)), started=started)


def test_a_later_start_time_is_a_restart_even_when_the_counters_grew_past():
    assert classify(_c(1000, 1.7e9), _c(5000, 1.7e9 + 600), 60) == STARTED_AGAIN
    assert classify(_c(1000, 1.7e9), _c(5000, 1.7e9 + 600, k=3), 60) == STARTED_AGAIN  # k changes only so
    assert classify(_c(1000, 1.7e9 + 600), _c(5000, 1.7e9), 60).startswith("an engine that started earlier")
    assert "did not restart" in classify(_c(1000, 1.7e9), _c(10, 1.7e9), 60)  # a glitch, not a restart
    assert classify(_c(1000, None), _c(10, 1.7e9), 60) == "restart"  # one side unknown: the counters tell
    # Found attacking the sidecar: a _created that creeps forward at every scrape (a relay stamping it)
    # over a lifetime of 10 M drafts is no restart: at 250,000 drafts/s at most, 60 s make 15 M.
    assert classify(_c(1e7, 1.7e9), _c(1e7 + 2000, 1.7e9 + 5), 1).startswith("a later start time, but more drafts")
    assert classify(_c(1e7, 1.7e9), _c(1e7 + 2000, 1.7e9 + 5), 60) == STARTED_AGAIN
    # Less than START_TIME_SLACK_SECONDS apart is the same start (helper-28: a jitter of 1 ms read as a restart).
    assert classify(_c(1e7, 1.7e9), _c(1e7 + 2000, 1.7e9 + 1e-6), 60) == "consistent"
    assert "did not restart" in classify(_c(1000, 1.7e9), _c(10, 1.7e9 + 0.999), 60)
    assert classify(_c(1000, 1.7e9), _c(10, 1.7e9 + 1.0), 60) == STARTED_AGAIN


def test_diff_counts_from_a_restart_whose_counters_grew_past_the_first_scrape():
    """before 1000 drafts, after 5000 from a process started in between: 5000 drafts, not 4000."""
    got = delta_engines({("m", "0"): _c(1000, 1.7e9)}, {("m", "0"): _c(5000, 1.7e9 + 600, k=3)})
    assert got.counters[("m", "0")].drafts == 5000 and got.restarted == (("m", "0"),)
    assert "its counters started again at 2023-11-14 22:23:20 UTC, k 2 -> 3" in got.warnings[0]
