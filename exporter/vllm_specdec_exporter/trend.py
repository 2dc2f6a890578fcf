"""A model's trend (the landing page's chart): one point per step of the longest window's
ring, what its engines did between two successive samples, over that window."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from . import config
from .derive import mean_acceptance_length, sum_counters, within
from .model import Counters, SeriesKey
from .restarts import delta

# A model's trend holds at most this many points: one per step of the longest window's ring.
TREND_POINTS = config.WINDOW_RESOLUTION + 1


@dataclass(frozen=True, slots=True)
class TrendPoint:
    """One step of a model's trend: what its engines did between two successive samples of the
    longest window's ring (window / WINDOW_RESOLUTION apart)."""

    t: float  # monotonic seconds: the end of the step
    drafts: float
    accepted: float
    per_position: tuple[float, ...]  # drafts with at least i+1 tokens accepted, summed over engines

    @property
    def mean_acceptance_length(self) -> float | None:
        """None without drafts, or out of its range 1..k+1 (counters that break vLLM's invariants)."""
        return mean_acceptance_length(self.drafts, self.accepted, len(self.per_position))

    @property
    def position_acceptance(self) -> tuple[float, ...]:
        """Per position, the share of drafts with at least position+1 tokens accepted (none without drafts,
        nor where one leaves 0..1: a step of counters that break vLLM's invariants draws nothing)."""
        shares = () if self.drafts <= 0 else tuple(n / self.drafts for n in self.per_position)
        return shares if all(within(x, 0.0, 1.0) is not None for x in shares) else ()


Totals = Mapping[SeriesKey, Counters]  # each engine's running total at one sample


class Trends:
    """Every model's trend: at most TREND_POINTS each, a new tuple only when a step ends (the
    views share it). A step is noted on the poll that ends it and folded in when read, in the
    poller's views thread, not on the loop."""

    def __init__(self, seconds: float):
        self._seconds = seconds  # the longest window: older points are dropped
        self._trends: dict[str, tuple[TrendPoint, ...]] = {}
        self._step: tuple[Totals, Totals, float] | None = None

    def step(self, before: Totals, after: Totals, t: float) -> None:
        """A step of the ring ended at ``t`` (``after`` is its sample)."""
        if self._step is not None:  # two steps with no read between: fold the first
            self._fold(*self._step)
        self._step = (before, after, t)

    def read(self) -> dict[str, tuple[TrendPoint, ...]]:
        """Each model's trend (oldest first; a step without drafts has no point); a model that
        drafted nothing in the window has none. Folds in the last step (one delta per engine:
        32 ms at 4,096 engines, k=8)."""
        if self._step is not None:
            self._fold(*self._step)
            self._step = None
        return dict(self._trends)

    def _fold(self, before: Totals, after: Totals, t: float) -> None:
        """One point per model for the step (per engine as a window reads it, summed), and the
        points older than the window dropped."""
        steps: dict[str, list[Counters]] = {}
        for key, now in after.items():
            steps.setdefault(key[0], []).append(delta(before.get(key), now)[0])
        sums = {model: sum_counters(cs) for model, cs in steps.items()}
        oldest = t - self._seconds
        trends: dict[str, tuple[TrendPoint, ...]] = {}
        for model in {*self._trends, *sums}:
            kept = tuple(p for p in self._trends.get(model, ()) if p.t > oldest)
            c = sums.get(model)
            if c is not None and c.drafts > 0:  # a step without drafts has nothing to draw: a gap (and a model gone ages out)
                kept = (*kept, TrendPoint(t, c.drafts, c.accepted, c.per_position))[-TREND_POINTS:]
            if kept:
                trends[model] = kept
        self._trends = trends
