"""Per-target history of counters with time-indexed windows, reset-aware, bounded.

Each poll's counters are folded into running totals per engine that never go down
(a restart adds the new values, as in ``derive.delta``; an engine's first value is
not counted), so a window's figures are
a plain difference between two samples however many restarts happened between
them. Each window keeps at most ~WINDOW_RESOLUTION samples spaced window/60 apart,
so memory is bounded whatever the uptime, and the window's start is known to
within 1/60 of its length (the exact span is reported).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from . import config
from .derive import delta, sum_counters
from .model import Counters, SeriesKey

Totals = Mapping[SeriesKey, Counters]


@dataclass(frozen=True, slots=True)
class HistorySample:
    t: float  # monotonic seconds
    totals: Totals


@dataclass(frozen=True, slots=True)
class Observation:
    """What one poll added: per-engine increments, and which engines restarted or appeared."""

    increments: dict[SeriesKey, Counters]
    restarted: tuple[SeriesKey, ...]
    appeared: tuple[SeriesKey, ...]


@dataclass(frozen=True, slots=True)
class WindowDelta:
    span_seconds: float
    engines: dict[SeriesKey, Counters]


class TargetHistory:
    def __init__(self, windows: Sequence[tuple[str, float]], forget_after: float):
        self._windows = tuple(windows)
        self._rings: dict[str, deque[HistorySample]] = {label: deque() for label, _ in windows}
        self._last_raw: dict[SeriesKey, Counters] = {}
        self._totals: dict[SeriesKey, Counters] = {}
        self._last_seen: dict[SeriesKey, float] = {}
        self._forget_after = forget_after  # an engine unseen this long is dropped
        self.latest: HistorySample | None = None

    def observe(self, t: float, raw: Mapping[SeriesKey, Counters]) -> Observation:
        first_poll = self.latest is None
        increments: dict[SeriesKey, Counters] = {}
        restarted, appeared = [], []
        for key, now in raw.items():
            prev = self._last_raw.get(key)
            self._last_seen[key] = t
            self._last_raw[key] = now
            if prev is None:
                # Counted before we watched it (at start-up, or an engine seen for the
                # first time or again after being forgotten): its running total starts
                # here. As in Prometheus's increase(), a new series' first value is not
                # an increment: counting it could add an engine's whole lifetime to a
                # window, while skipping it loses at most one poll interval.
                self._totals[key] = _zero(now.k, now.generation_tokens is not None)
                if not first_poll:
                    appeared.append(key)
                continue
            inc, reset = delta(prev, now)
            increments[key] = inc
            if reset:
                restarted.append(key)
            total = self._totals.get(key)
            # k only changes across a restart; a new running total makes the window
            # difference treat it as one (derive.delta compares k).
            self._totals[key] = inc if total is None or total.k != inc.k else sum_counters([total, inc])
        for key in [k for k, seen in self._last_seen.items() if t - seen > self._forget_after]:
            for d in (self._last_seen, self._last_raw, self._totals):
                d.pop(key, None)

        sample = HistorySample(t, dict(self._totals))
        self.latest = sample
        for label, seconds in self._windows:
            ring = self._rings[label]
            if not ring or t - ring[-1].t >= seconds / config.WINDOW_RESOLUTION:
                ring.append(sample)
            # Keep exactly one sample at or before the window's start.
            while len(ring) >= 2 and ring[1].t <= t - seconds:
                ring.popleft()
        return Observation(increments, tuple(restarted), tuple(appeared))

    def window(self, label: str) -> WindowDelta | None:
        """Counters accrued over the window (or since the first poll, if shorter)."""
        ring = self._rings[label]
        if not ring or self.latest is None:
            return None
        start, end = ring[0], self.latest
        engines = {key: delta(start.totals.get(key), now)[0] for key, now in end.totals.items()}
        return WindowDelta(end.t - start.t, engines)

    def sample_count(self) -> int:
        return len({id(s) for ring in self._rings.values() for s in ring})


def _zero(k: int, with_generation: bool) -> Counters:
    return Counters(0.0, 0.0, 0.0, (0.0,) * k, 0.0 if with_generation else None)
