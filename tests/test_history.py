"""Windows over the history: reset-aware, k changes, bounded memory."""

from __future__ import annotations

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
    h.observe(20, {KEY: c(50)})  # restart: +50
    obs = h.observe(30, {KEY: c(150)})
    assert obs.restarted == ()
    w = h.window("1m")
    assert w.span_seconds == 30
    assert w.engines[KEY].drafts == 100 + 50 + 100


def test_k_change_across_a_restart_starts_a_new_total():
    h = TargetHistory(WINDOWS, 4000)
    h.observe(0, {KEY: c(1000)})
    h.observe(10, {KEY: c(1100)})
    obs = h.observe(20, {KEY: c(40, k=3)})
    assert obs.restarted == (KEY,)
    w = h.window("1m")
    assert w.engines[KEY].k == 3 and w.engines[KEY].drafts == 40


def test_window_start_is_within_a_sixtieth_of_the_window():
    h = TargetHistory(WINDOWS, 4000)
    for t in range(0, 7201):
        h.observe(float(t), {KEY: c(10.0 * t)})
    for label, seconds in WINDOWS:
        w = h.window(label)
        assert seconds <= w.span_seconds <= seconds * (1 + 1 / config.WINDOW_RESOLUTION) + 1
        assert w.engines[KEY].drafts == pytest.approx(10 * w.span_seconds)


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


def test_a_new_engine_counts_from_its_first_poll():
    h = TargetHistory(WINDOWS, 4000)
    h.observe(0, {KEY: c(100)})
    obs = h.observe(10, {KEY: c(200), ("m", "1"): c(50)})
    assert obs.appeared == (("m", "1"),) and ("m", "1") not in obs.increments
    h.observe(20, {KEY: c(300), ("m", "1"): c(80)})
    assert h.window("1m").engines[("m", "1")].drafts == 30
