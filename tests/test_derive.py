"""The math against hand-computed values."""

from __future__ import annotations

import math

import pytest
from vllm_specdec_exporter.derive import derive, invariant_violations, sum_counters
from vllm_specdec_exporter.model import Counters


def test_broken_v4_pro_case_from_the_docs():
    # vllm-metrics.md: drafts +6590, draft tokens +13180, accepted +240, per pos [235, 5]
    s = derive(Counters(6590, 13180, 240, (235, 5)))
    assert s.mean_acceptance_length == pytest.approx(1.0364, abs=5e-5)
    assert s.acceptance_rate == pytest.approx(0.0182, abs=5e-5)
    assert s.per_position_acceptance == pytest.approx([235 / 6590, 5 / 6590])
    assert s.conditional_acceptance == pytest.approx([235 / 6590, 5 / 235])
    assert s.k == 2
    assert s.effective_draft_length == 2.0
    assert s.warnings == []


def test_healthy_v4_pro_k2_native_checkpoint():
    # baselines.md: per position 0.924 / 0.687 -> AL 2.611, conditional 0.924 / 0.7435
    c = Counters(drafts=1000, draft_tokens=2000, accepted=924 + 687, per_position=(924, 687))
    s = derive(c)
    assert s.mean_acceptance_length == pytest.approx(2.611)
    assert s.acceptance_rate == pytest.approx(0.8055)
    assert s.conditional_acceptance[1] == pytest.approx(0.7435, abs=5e-5)
    assert s.marginal_acceptance_length == pytest.approx([0.924, 0.687])
    assert s.acceptance_length_at_k == pytest.approx([1.924, 2.611])


def test_rates_per_second_only_with_an_interval():
    c = Counters(100, 200, 150, (90, 60), generation_tokens=250)
    assert derive(c).drafts_per_second is None
    s = derive(c, interval_seconds=10)
    assert (s.drafts_per_second, s.drafted_tokens_per_second, s.accepted_tokens_per_second) == (10, 20, 15)
    assert s.draft_token_share == pytest.approx(150 / 250)


def test_zero_drafts_is_undefined_not_zero():
    s = derive(Counters(0, 0, 0, (0, 0, 0), generation_tokens=0))
    assert s.mean_acceptance_length is None
    assert s.acceptance_rate is None
    assert s.effective_draft_length is None
    assert s.per_position_acceptance == [None, None, None]
    assert s.conditional_acceptance == [None, None, None]
    assert s.acceptance_length_at_k == [None, None, None]
    assert s.draft_token_share is None
    assert s.k == 3


def test_conditional_is_undefined_after_a_position_never_accepted():
    s = derive(Counters(10, 20, 4, (4, 0)))
    assert s.conditional_acceptance == [0.4, 0.0]
    s = derive(Counters(10, 30, 4, (4, 0, 0)))
    assert s.conditional_acceptance[2] is None


def test_engines_are_summed_before_dividing():
    # A busy healthy engine and an idle broken one: the mean of ratios would say
    # AL 1.5; summing counters says the fleet really runs at 1.99.
    busy = Counters(1000, 1000, 990, (990,))
    idle = Counters(10, 10, 0, (0,))
    total = sum_counters([busy, idle])
    assert total == Counters(1010, 1010, 990, (990,))
    assert derive(total).mean_acceptance_length == pytest.approx(1 + 990 / 1010)


def test_generation_tokens_share_needs_every_engine():
    assert sum_counters([Counters(1, 1, 1, (1,), 5), Counters(1, 1, 1, (1,), None)]).generation_tokens is None
    assert sum_counters([Counters(1, 1, 1, (1,), 5), Counters(1, 1, 1, (1,), 7)]).generation_tokens == 12


@pytest.mark.parametrize(
    "counters, expected",
    [
        (Counters(10, 20, 9, (5, 3)), "sum(accepted_per_position)=8 != accepted=9"),
        (Counters(10, 20, 9, (4, 5)), "position 1 (5) exceeds position 0 (4)"),
        (Counters(10, 20, 23, (12, 11)), "position 0 (12) exceeds drafts (10)"),
        (Counters(10, 5, 8, (5, 3)), "accepted=8 exceeds draft_tokens=5"),
        (Counters(10, 25, 8, (5, 3)), "draft_tokens=25 exceeds k*drafts=2*10"),
    ],
)
def test_each_invariant_is_reported_naming_the_series(counters, expected):
    found = invariant_violations(counters, 'model_name="m",engine="3"')
    assert any(expected in w and w.startswith('model_name="m",engine="3"') for w in found), found


def test_invariants_hold_quietly_on_healthy_counters():
    assert invariant_violations(Counters(1e6, 2e6, 1.6e6, (0.9e6, 0.7e6)), "x") == []
    assert invariant_violations(Counters(0, 0, 0, (0, 0)), "x") == []


def test_violations_are_reported_not_fixed():
    c = Counters(10, 20, 9, (5, 3))
    s = derive(c, warnings=invariant_violations(c, "x"))
    assert s.num_accepted_tokens == 9  # the counter as read, not "corrected" to 8
    assert s.mean_acceptance_length == pytest.approx(1.9)
    assert s.warnings


def test_json_form_has_nulls_and_integers():
    j = derive(Counters(0.0, 0.0, 0.0, (0.0,))).to_json()
    assert j["mean_acceptance_length"] is None and j["num_drafts"] == 0 and isinstance(j["num_drafts"], int)
    assert not any(isinstance(v, float) and math.isnan(v) for v in j.values())


def test_counters_that_break_the_invariants_give_no_figure_out_of_its_range():
    """Found attacking the sidecar: impossible counters were exported as figures out of any range
    (AL 9.0 at k=2, conditionals of 7 and 8, an acceptance rate of 1.73); reliability.md says no
    figure leaves its range. Each such figure is undefined; the ones in range stay."""
    from vllm_specdec_exporter.derive import derive

    s = derive(Counters(100, 300, 800, (500, 300)))  # accepted 8 per draft at k=2, positions over drafts
    assert s.mean_acceptance_length is None and s.acceptance_rate is None
    assert s.per_position_acceptance == [None, None] and s.conditional_acceptance == [None, 0.6]
    assert s.acceptance_length_at_k == [None, None] and s.effective_draft_length is None  # 3 > k
    s = derive(Counters(100, 200, 150, (70, 80)))  # position 1 above position 0
    assert s.per_position_acceptance == [0.7, 0.8] and s.conditional_acceptance == [0.7, None]
    assert s.mean_acceptance_length == 2.5 and s.acceptance_length_at_k == [1.7, 2.5]
    assert s.accepted_count_ratio[:2] == [pytest.approx(0.3), None]  # -0.1 drafts "accepted exactly 1"
    healthy = derive(Counters(100, 200, 160, (90, 70)))
    assert (healthy.mean_acceptance_length, healthy.per_position_acceptance) == (2.6, [0.9, 0.7])
    assert healthy.acceptance_length_at_k == [pytest.approx(1.9), pytest.approx(2.6)]
