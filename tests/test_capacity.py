"""capacity.py: what a broken head costs, on hand-worked figures (issue 34)."""

from __future__ import annotations

import math

import pytest
from vllm_specdec_exporter.capacity import break_even, capacity, describe

COST = 0.05  # the default draft step cost: DeepSeek-V3's MTP, 1.8x at AL 1.85-1.90


def test_the_v4_pro_incident_against_its_healthy_figure():
    # Healthy native V4-Pro k=2: AL 2.611; the broken conversion: 1.036 (baselines.md).
    c = capacity(1.036, 2.611, 2, COST, drafts_per_second=100.0)
    assert c.step_factor == pytest.approx(2.52027, abs=1e-5)  # 2.611 / 1.036
    assert c.wasted_share == pytest.approx(0.60322, abs=1e-5)  # 1 - 1.036 / 2.611
    assert c.healthy_tokens_per_second == pytest.approx(261.1)  # 100 drafts/s x 2.611
    assert c.slower_than_off  # 1.036 < 1 + 0.05 x 2 = 1.10
    assert describe(c).startswith("decode needs 2.5x the steps of a healthy head: 60% of decode work wasted; ")
    assert "slower than no speculative decoding" in describe(c)


def test_a_head_above_its_reference_wastes_nothing():
    c = capacity(2.70, 2.27, 2, COST)
    assert c.step_factor == pytest.approx(2.27 / 2.70) and c.wasted_share == 0.0
    assert c.healthy_tokens_per_second is None and not c.slower_than_off
    assert describe(c) == ""  # nothing wasted, not slower: nothing to say


@pytest.mark.parametrize("k, al", [(1, 1.05), (2, 1.10), (3, 1.15), (7, 1.35)])
def test_break_even_grows_with_k(k, al):
    assert break_even(k, COST) == pytest.approx(al)
    assert capacity(al - 0.001, 2.0, k, COST).slower_than_off
    assert not capacity(al + 0.001, 2.0, k, COST).slower_than_off


@pytest.mark.parametrize("args", [(None, 2.0, 2), (1.5, None, 2), (1.5, 2.0, None), (1.5, 2.0, 0), (0.5, 2.0, 2),
                                  (math.nan, 2.0, 2), (1.5, math.inf, 2)])
def test_no_figure_without_a_reference_a_current_al_or_k(args):
    assert capacity(*args, COST) is None


def test_an_idle_rate_is_not_a_figure():
    assert capacity(1.5, 2.0, 2, COST, drafts_per_second=math.nan).healthy_tokens_per_second is None


def test_below_break_even_with_nothing_wasted_says_only_that():
    # A profile at 1.0 (allowed) and AL 1.0 at k=2: no waste against it, but drafting does not pay.
    c = capacity(1.0, 1.0, 2, COST)
    assert describe(c) == ("speculative decoding is currently slower than no speculative decoding: "
                           "consider turning it off until the head is fixed")
