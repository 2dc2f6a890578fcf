"""What a draft head costs in decode capacity (issue 34), from the counters alone.

Each verification step produces AL tokens on average (the accepted draft tokens and the one
the model adds), so the same output takes AL_healthy / AL_now times the steps a healthy head
would take: for the DeepSeek-V4-Pro incident (healthy 2.611, broken 1.036) 2.52x, and 60 %
of the decode steps re-do what a healthy head would have produced. The same steps with a
healthy head would have produced drafts/s x AL_healthy output tokens per second.

Break-even: a step that drafts k tokens costs more than a plain decode step, by
draft_step_cost x k (the draft passes, and verifying k + 1 tokens instead of one). Below
AL = 1 + draft_step_cost x k, speculative decoding is slower than no speculative decoding.
The default cost, 0.05 of a decode step per draft token, is from DeepSeek-V3's report (MTP
at k=1: 85-90 % acceptance, so AL 1.85-1.90, gave 1.8x the decoding speed: a step cost
1.03-1.06 plain steps); a draft model costs more, and its cost is configurable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Capacity:
    step_factor: float  # AL_healthy / AL_now: decode steps needed against a healthy head's
    wasted_share: float  # 1 - AL_now / AL_healthy, at least 0: decode steps spent re-doing
    healthy_tokens_per_second: float | None  # drafts/s x AL_healthy (None: no rate known)
    slower_than_off: bool  # AL_now under the break-even: turning speculative decoding off is faster


def break_even(k: int, draft_step_cost: float) -> float:
    """The AL under which drafting k tokens a step costs more than it returns."""
    return 1 + draft_step_cost * k


def capacity(
    al_now: float | None,
    al_healthy: float | None,
    k: int | None,
    draft_step_cost: float,
    drafts_per_second: float | None = None,
) -> Capacity | None:
    """The cost of the head at ``al_now`` against a healthy ``al_healthy``; None (never a fake
    figure) without a current AL, a healthy reference or k."""
    if al_now is None or al_healthy is None or not k or al_now < 1 or al_healthy < 1:
        return None
    if not (math.isfinite(al_now) and math.isfinite(al_healthy)):
        return None
    tokens = drafts_per_second * al_healthy if drafts_per_second is not None and math.isfinite(drafts_per_second) else None
    return Capacity(
        step_factor=al_healthy / al_now,
        wasted_share=max(0.0, 1 - al_now / al_healthy),
        healthy_tokens_per_second=tokens,
        slower_than_off=al_now < break_even(k, draft_step_cost),
    )


SLOWER_THAN_OFF = (
    "speculative decoding is currently slower than no speculative decoding: consider turning it off until the head is fixed"
)


def describe(c: Capacity) -> str:
    """One line for the health text and the report: the waste where there is some (never
    "0 % wasted"), and the break-even where drafting is below it; empty when neither."""
    parts = []
    if c.wasted_share >= 0.005:
        parts.append(f"decode needs {c.step_factor:.1f}x the steps of a healthy head: {c.wasted_share:.0%} of decode work wasted")
    if c.slower_than_off:
        parts.append(SLOWER_THAN_OFF)
    return "; ".join(parts)
