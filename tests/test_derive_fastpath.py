"""derive's hot path written out for speed (issue 22 item 4) gives what the plain version gave:
the same figures, the same JSON in the same key order, the same invariant messages, on any
counters (zeros, negatives, NaN, infinities, integers)."""

from __future__ import annotations

import json
import math
from dataclasses import fields

from hypothesis import given, settings
from hypothesis import strategies as st
from vllm_specdec_exporter import config
from vllm_specdec_exporter.derive import Stats, derive, invariant_violations, ratio
from vllm_specdec_exporter.model import Counters, RequestHistogram


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
