"""The math against hand-computed values."""

from __future__ import annotations

import json
import math
from dataclasses import fields

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm_specdec_exporter import config
from vllm_specdec_exporter.derive import Stats, derive, invariant_violations, ratio, sum_counters
from vllm_specdec_exporter.model import Counters, RequestHistogram


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


# ------------------------------------------------------------
# derive's hot path written out for speed (issue 22 item 4) gives what the plain version gave:
# the same figures, the same JSON in the same key order, the same invariant messages, on any
# counters (zeros, negatives, NaN, infinities, integers).

def _lt(a, b):
    return b - a > config.INVARIANT_RELATIVE_TOLERANCE * max(1.0, abs(a), abs(b))


def reference_violations(c: Counters, series: str) -> list[str]:
    """invariant_violations before it was written out."""
    out = []
    pos_sum = sum(c.per_position)
    if c.k and (_lt(pos_sum, c.accepted) or _lt(c.accepted, pos_sum)):
        out.append(f"{series}: sum(accepted_per_position)={pos_sum:g} != accepted={c.accepted:g}")
    chain = (c.drafts, *c.per_position)
    for i in range(1, len(chain)):
        if _lt(chain[i - 1], chain[i]):
            lower = "drafts" if i == 1 else f"position {i - 2}"
            out.append(f"{series}: position {i - 1} ({chain[i]:g}) exceeds {lower} ({chain[i - 1]:g})")
    if _lt(c.draft_tokens, c.accepted):
        out.append(f"{series}: accepted={c.accepted:g} exceeds draft_tokens={c.draft_tokens:g}")
    if c.k and _lt(c.k * c.drafts, c.draft_tokens):
        out.append(f"{series}: draft_tokens={c.draft_tokens:g} exceeds k*drafts={c.k}*{c.drafts:g}")
    return out


def _finite(v):
    if type(v) is float:
        return v if math.isfinite(v) else None
    if type(v) is list:
        return [x if type(x) is not float or math.isfinite(x) else None for x in v]
    return v


def _count(v):
    if v is None or not math.isfinite(v):
        return None
    return int(v) if float(v).is_integer() else v


def reference_json(s: Stats) -> dict:
    """Stats.to_json before it was written out."""
    out = {f.name: _finite(getattr(s, f.name)) for f in fields(Stats)}
    if s.request_acceptance is None:
        del out["request_acceptance"]
    else:
        out["request_acceptance"] = s.request_acceptance.to_json()
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_generation_tokens"):
        out[key] = _count(getattr(s, key))
    out["accepted_per_position"] = [_count(v) for v in s.accepted_per_position]
    out["accepted_count_drafts"] = [_count(v) for v in s.accepted_count_drafts]
    out["warnings"] = list(s.warnings)
    return out


def _share(x):
    """A share in [0, 1] (float rounding allowed), or none: counters that break vLLM's invariants
    give no figure out of its range (found attacking the sidecar: AL 9 at k=2, conditionals of 7)."""
    return x if x is None or -1e-9 <= x <= 1 + 1e-9 else None


def reference_lists(c: Counters) -> tuple[list, list, list]:
    """derive's survival, conditional and exactly-j share lists before they were written out."""
    per_pos = list(c.per_position)
    exactly = [a - b for a, b in zip([c.drafts, *per_pos], [*per_pos, 0.0], strict=True)] if c.k else []
    return ([_share(ratio(v, c.drafts)) for v in per_pos],
            [_share(ratio(v, prev)) for prev, v in zip([c.drafts, *per_pos], per_pos, strict=False)],
            [_share(ratio(v, c.drafts)) for v in exactly])


value = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10**6),
                  st.sampled_from([0.0, -0.0, 1e-320, 1e308, 5e-324]))
counters = st.builds(
    Counters, value, value, value, st.lists(value, max_size=5).map(tuple),
    st.one_of(st.none(), value),
    st.one_of(st.none(), st.just(RequestHistogram((0.25, 0.5, 0.9), (1.0, 2.0, 3.0), 4.0))),
)


def _same(a, b) -> bool:
    return json.dumps(a, default=repr) == json.dumps(b, default=repr)  # NaN-safe, order-sensitive


@settings(max_examples=400, deadline=None)
@given(counters, st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)))
def test_written_out_derive_is_the_plain_one(c, interval):
    assert invariant_violations(c, "s") == reference_violations(c, "s")
    s = derive(c, interval, ["w"])
    assert _same(s.to_json(), reference_json(s))
    assert list(s.to_json()) == [f.name for f in fields(Stats) if f.name != "request_acceptance"
                                 or s.request_acceptance is not None]
    assert _same([s.per_position_acceptance, s.conditional_acceptance, s.accepted_count_ratio],
                 list(reference_lists(c)))
