"""Pure derivation math over counters and deltas, with vLLM's own definitions.

- mean acceptance length AL = 1 + accepted / drafts (the bonus token included)
- acceptance rate = accepted / draft_tokens (never k * drafts: drafts get trimmed)
- per-position acceptance = per_pos[i] / drafts, a survival curve P(len >= i+1)
- conditional acceptance = per_pos[i] / per_pos[i-1], with per_pos[-1] = drafts
- acceptance-count distribution: drafts that accepted exactly j tokens = per_pos[j-1] - per_pos[j]
  (per_pos[-1] = drafts, per_pos[k] = 0), shared over drafts: the "acceptance histogram"
- engines: sum the counters first, then divide; never average ratios
- a quantity with a zero denominator is undefined (None), never 0

How two readings of one engine relate (a restart, a glitch) is restarts.py's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from . import config
from .model import Counters, RequestHistogram


def ratio(numerator: float, denominator: float) -> float | None:
    if not denominator > 0:
        return None
    value = numerator / denominator
    return value if math.isfinite(value) else None  # never a non-finite figure


def sum_histograms(items: list[RequestHistogram | None]) -> RequestHistogram | None:
    """Engines' histograms summed: all of them with the same buckets, or none (a share over
    only some engines' requests would be wrong)."""
    first = items[0] if items else None
    if first is None or any(h is None or h.edges != first.edges for h in items):
        return None
    hs = [h for h in items if h is not None]
    return RequestHistogram(first.edges, tuple(map(sum, zip(*(h.cumulative for h in hs), strict=True))), sum(h.count for h in hs))


def sum_counters(items: Iterable[Counters]) -> Counters:
    """Engine aggregation: sums of counters (k = the largest k seen)."""
    items = list(items)
    k = max((c.k for c in items), default=0)
    per_position = [0.0] * k
    for c in items:
        for i, v in enumerate(c.per_position):
            per_position[i] += v
    generation = [c.generation_tokens for c in items if c.generation_tokens is not None]
    return Counters(
        drafts=sum(c.drafts for c in items),
        draft_tokens=sum(c.draft_tokens for c in items),
        accepted=sum(c.accepted for c in items),
        per_position=tuple(per_position),
        # A share over only some engines' tokens would be wrong: all or nothing.
        generation_tokens=sum(generation) if items and len(generation) == len(items) else None,
        request_acceptance=sum_histograms([c.request_acceptance for c in items]),
    )


def _lt(a: float, b: float) -> bool:
    """a < b beyond float noise."""
    return b - a > config.INVARIANT_RELATIVE_TOLERANCE * max(1.0, abs(a), abs(b))


def invariant_violations(c: Counters, series: str) -> list[str]:
    """vLLM's counter invariants; each violation names the series. Never 'fixed'.
    (Each check is _lt written out, led by a plain comparison that settles the usual case: b - a
    can exceed a positive tolerance only when b > a. This runs for every engine, every time.)"""
    out = []
    tol = config.INVARIANT_RELATIVE_TOLERANCE
    per_position, drafts, draft_tokens, accepted = c.per_position, c.drafts, c.draft_tokens, c.accepted
    k = len(per_position)
    if k:
        pos_sum = sum(per_position)
        if pos_sum != accepted and abs(accepted - pos_sum) > tol * max(1.0, abs(pos_sum), abs(accepted)):
            out.append(f"{series}: sum(accepted_per_position)={pos_sum:g} != accepted={accepted:g}")
        before = drafts
        for i, now in enumerate(per_position, 1):
            if now > before and now - before > tol * max(1.0, abs(before), abs(now)):
                lower = "drafts" if i == 1 else f"position {i - 2}"
                out.append(f"{series}: position {i - 1} ({now:g}) exceeds {lower} ({before:g})")
            before = now
    if accepted > draft_tokens and accepted - draft_tokens > tol * max(1.0, abs(draft_tokens), abs(accepted)):
        out.append(f"{series}: accepted={accepted:g} exceeds draft_tokens={draft_tokens:g}")
    if k and draft_tokens > k * drafts and _lt(k * drafts, draft_tokens):
        out.append(f"{series}: draft_tokens={draft_tokens:g} exceeds k*drafts={k}*{drafts:g}")
    return out


@dataclass(frozen=True, slots=True)
class RequestAcceptance:
    """Shares of finished requests at the extremes of per-request acceptance, read at the
    histogram's bucket edges (never interpolated): the share at or below ``below_edge``
    (the nearest edge at or below REQUEST_ACCEPTANCE_LOW) and above ``above_edge`` (the
    nearest at or above REQUEST_ACCEPTANCE_HIGH, below 1). No such edge: None."""

    requests: float
    below_edge: float | None
    below_ratio: float | None
    above_edge: float | None
    above_ratio: float | None

    @property
    def exact(self) -> bool:
        """Both read at the thresholds themselves, not at a neighbouring edge."""
        return self.below_edge == config.REQUEST_ACCEPTANCE_LOW and self.above_edge == config.REQUEST_ACCEPTANCE_HIGH

    def to_json(self) -> dict[str, object]:
        return {
            "requests": _count(self.requests),
            "below_edge": self.below_edge,
            "below_ratio": self.below_ratio,
            "above_edge": self.above_edge,
            "above_ratio": self.above_ratio,
            "exact": self.exact,
            "thresholds": [config.REQUEST_ACCEPTANCE_LOW, config.REQUEST_ACCEPTANCE_HIGH],
        }


def request_acceptance(h: RequestHistogram) -> RequestAcceptance:
    low = [i for i, e in enumerate(h.edges) if e <= config.REQUEST_ACCEPTANCE_LOW]
    # An edge at 1 (or above) says nothing: no request's acceptance exceeds 1.
    high = [i for i, e in enumerate(h.edges) if config.REQUEST_ACCEPTANCE_HIGH <= e < 1.0]
    lo, hi = (low[-1] if low else None), (high[0] if high else None)
    return RequestAcceptance(
        requests=h.count,
        below_edge=None if lo is None else h.edges[lo],
        below_ratio=None if lo is None else ratio(h.cumulative[lo], h.count),
        above_edge=None if hi is None else h.edges[hi],
        above_ratio=None if hi is None else ratio(h.count - h.cumulative[hi], h.count),
    )


@dataclass(frozen=True, slots=True)
class Stats:
    """Everything derived from one set of (summed or per-engine) counters."""

    num_drafts: float
    num_draft_tokens: float
    num_accepted_tokens: float
    accepted_per_position: list[float]
    num_generation_tokens: float | None
    k: int
    mean_acceptance_length: float | None
    acceptance_rate: float | None
    per_position_acceptance: list[float | None]
    conditional_acceptance: list[float | None]
    effective_draft_length: float | None
    # AL gained from position i; AL = 1 + sum(marginal), so by vLLM's definitions
    # it equals the survival figure per_pos[i] / drafts.
    marginal_acceptance_length: list[float | None]
    # The AL a chain drafter would reach with k = i + 1 (positions beyond i dropped).
    acceptance_length_at_k: list[float | None]
    # Drafts (verify steps) that accepted exactly j = 0..k draft tokens, and their share of
    # all drafts; empty without per-position counters (k = 0).
    accepted_count_drafts: list[float]
    accepted_count_ratio: list[float | None]
    draft_token_share: float | None  # accepted / generation tokens
    drafts_per_second: float | None
    drafted_tokens_per_second: float | None
    accepted_tokens_per_second: float | None
    warnings: list[str] = field(default_factory=list)
    # Only when the producer has vLLM's per-request histogram (PR #44487): absent, no key.
    request_acceptance: RequestAcceptance | None = None

    def to_json(self) -> dict[str, object]:
        # Written out field by field, in field order (dataclasses.asdict deep-copies: slow; a
        # loop over fields with getattr was a third of a DP=8 summary). JSON (RFC 8259) has no
        # Infinity or NaN: a non-finite figure is null.
        out: dict[str, object] = {
            "num_drafts": _count(self.num_drafts),
            "num_draft_tokens": _count(self.num_draft_tokens),
            "num_accepted_tokens": _count(self.num_accepted_tokens),
            "accepted_per_position": [_count(v) for v in self.accepted_per_position],
            "num_generation_tokens": _count(self.num_generation_tokens),
            "k": self.k,
            "mean_acceptance_length": _finite(self.mean_acceptance_length),
            "acceptance_rate": _finite(self.acceptance_rate),
            "per_position_acceptance": _finite(self.per_position_acceptance),
            "conditional_acceptance": _finite(self.conditional_acceptance),
            "effective_draft_length": _finite(self.effective_draft_length),
            "marginal_acceptance_length": _finite(self.marginal_acceptance_length),
            "acceptance_length_at_k": _finite(self.acceptance_length_at_k),
            "accepted_count_drafts": [_count(v) for v in self.accepted_count_drafts],
            "accepted_count_ratio": _finite(self.accepted_count_ratio),
            "draft_token_share": _finite(self.draft_token_share),
            "drafts_per_second": _finite(self.drafts_per_second),
            "drafted_tokens_per_second": _finite(self.drafted_tokens_per_second),
            "accepted_tokens_per_second": _finite(self.accepted_tokens_per_second),
            "warnings": list(self.warnings),
        }
        if self.request_acceptance is not None:
            out["request_acceptance"] = self.request_acceptance.to_json()
        return out


def _count(v: float | None) -> float | int | None:
    if v is None or not math.isfinite(v):
        return None
    return int(v) if float(v).is_integer() else v


def _finite(v: object) -> object:
    """JSON (RFC 8259) has no Infinity or NaN: a non-finite figure is null (Stats' lists are flat)."""
    if type(v) is float:
        return v if math.isfinite(v) else None
    if type(v) is list:
        return [x if type(x) is not float or math.isfinite(x) else None for x in v]
    return v


_SLACK = 1e-9  # float rounding of a sum of k ratios each at most 1


def within(x: float | None, low: float, high: float) -> float | None:
    """``x`` if it lies in its range: counters that break vLLM's invariants (a producer's lie, a
    partial scrape) give no figure, rather than an AL of 9 at k=2 (invariant_violations says why)."""
    return x if x is None or low - _SLACK <= x <= high + _SLACK else None


def mean_acceptance_length(drafts: float, accepted: float, k: int) -> float | None:
    """vLLM's mean acceptance length, 1 + accepted / drafts: None without drafts, or out of its
    range 1..k+1 (no bound above for a producer without per-position counters: k unknown)."""
    return None if (r := ratio(accepted, drafts)) is None else within(1.0 + r, 1.0, k + 1.0 if k else math.inf)


def derive(c: Counters, interval_seconds: float | None = None, warnings: Iterable[str] = ()) -> Stats:
    # The ratios over drafts are ``ratio`` written out (it runs per engine, per window, per poll),
    # each kept within its range (``within``: a bounded range also refuses NaN and infinities).
    per_pos = list(c.per_position)
    k, drafts = len(per_pos), c.drafts
    top = k or math.inf  # a producer with no per-position counters: k unknown
    survival: list[float | None] = [within(v / drafts, 0.0, 1.0) for v in per_pos] if drafts > 0 else [None] * k
    conditional: list[float | None] = [
        within(v / prev, 0.0, 1.0) if prev > 0 else None for prev, v in zip([drafts, *per_pos], per_pos, strict=False)
    ]
    at_k: list[float | None] = [None] * k
    if drafts > 0:
        running = 1.0
        for i, v in enumerate(per_pos):
            running += v / drafts
            at_k[i] = within(running, 1.0, i + 2.0)
    # Steps with exactly j accepted: survivors at j minus survivors at j + 1.
    exactly = [a - b for a, b in zip([drafts, *per_pos], [*per_pos, 0.0], strict=True)] if k else []
    count_ratio: list[float | None] = [within(v / drafts, 0.0, 1.0) for v in exactly] if drafts > 0 else [None] * len(exactly)

    def per_second(v: float) -> float | None:
        return ratio(v, interval_seconds) if interval_seconds else None

    return Stats(
        num_drafts=c.drafts,
        num_draft_tokens=c.draft_tokens,
        num_accepted_tokens=c.accepted,
        accepted_per_position=per_pos,
        num_generation_tokens=c.generation_tokens,
        k=k,
        mean_acceptance_length=mean_acceptance_length(c.drafts, c.accepted, k),
        acceptance_rate=within(ratio(c.accepted, c.draft_tokens), 0.0, 1.0),
        per_position_acceptance=survival,
        conditional_acceptance=conditional,
        effective_draft_length=within(ratio(c.draft_tokens, c.drafts), 0.0, top),
        marginal_acceptance_length=list(survival),
        acceptance_length_at_k=at_k,
        accepted_count_drafts=exactly,
        accepted_count_ratio=count_ratio,
        draft_token_share=within(ratio(c.accepted, c.generation_tokens), 0.0, 1.0) if c.generation_tokens is not None else None,
        drafts_per_second=per_second(c.drafts),
        drafted_tokens_per_second=per_second(c.draft_tokens),
        accepted_tokens_per_second=per_second(c.accepted),
        warnings=list(warnings),
        request_acceptance=None if c.request_acceptance is None else request_acceptance(c.request_acceptance),
    )
