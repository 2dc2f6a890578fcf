"""Per-target history of counters with time-indexed windows: glitch-proof, bounded.

Each poll's counters are folded into running totals per engine that never go down,
so a window's figures are a plain difference between two samples however many
restarts happened between them. Each window keeps at most ~WINDOW_RESOLUTION
samples spaced window/60 apart, so memory is bounded whatever the uptime, and the
window's start is known to within 1/60 of its length (the exact span is reported).

What one poll of an engine means, compared with the engine's last consistent poll
(its *base*); README "A glitch is not a restart" says the same:

- consistent: every counter is at or above the base, k is unchanged and drafts
  grew no faster than ``config.MAX_DRAFTS_PER_SECOND``. The difference is added.
- restart: vLLM restarts the whole process, so *all* of the engine's counters start
  again near zero: drafts, draft tokens and accepted tokens all went down, and the
  new drafts are no more than a restart since the base could have made
  (``MAX_DRAFTS_PER_SECOND`` x the time since the base). k may change. Nothing is
  added until the next poll confirms it (its counters at or above the restarted
  ones, not back at the old ones); then the values since the restart are added.
- inconsistent: anything else -- only some series went down (one position dipping),
  k changed without a restart (a payload cut between an engine's positions, a
  position series appearing), values no restart could produce (a "restart" to
  millions of drafts, a jump faster than any engine), or two alternating sets of
  values (two servers behind one URL). Nothing is added and the base is kept; the
  next poll consistent with the base counts from it, and a second inconsistent poll
  in a row becomes the new base (re-based: the data between is not counted).

An engine's first value is never an increment (as in Prometheus's increase()).

Generation tokens and the per-request histogram are read beside the counters, each
with its own base (``_Side``): a poll where one of them is missing, has other
buckets or went down (vLLM writes the histogram last, so a cut scrape loses it
first) skips that series alone, and never touches the counters or their restarts.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from . import config
from .admission import admit
from .derive import sum_counters
from .model import Counters, RequestHistogram, SeriesKey
from .restarts import CONSISTENT, RESTART, STARTED_AGAIN, align_k, classify, delta, difference, started_elsewhen
from .trend import TrendPoint, Trends

GREW_PAST = "grew past"  # a pending poll: a later start time with the counters gone on, not yet kept
MOVING_START = "a later start time (_created) at each poll, the counters going on: no restart (stamped at each scrape?)"


@dataclass(frozen=True, slots=True)
class HistorySample:
    t: float  # monotonic seconds
    totals: dict[SeriesKey, Counters]  # each engine's running total; a forgotten one's dropped (_forget)


@dataclass(frozen=True, slots=True)
class Observation:
    """What one poll added: per-engine increments, and which engines restarted,
    appeared, or were inconsistent (with the reason, a fixed phrase), or had a side
    series skipped."""

    increments: dict[SeriesKey, Counters]
    restarted: tuple[SeriesKey, ...]
    appeared: tuple[SeriesKey, ...]
    inconsistent: tuple[tuple[SeriesKey, str], ...] = ()
    # A side series (generation tokens, the histogram) skipped while the counters were counted.
    skipped: tuple[tuple[SeriesKey, str], ...] = ()


@dataclass(frozen=True, slots=True)
class WindowDelta:
    span_seconds: float
    engines: dict[SeriesKey, Counters]


@dataclass(slots=True)
class _Side:
    """A series read beside the counters, with its own base and running total: the
    generation tokens (shape ``()``) or the per-request histogram (shape: its edges).

    Its trouble stays its own: a poll where it is missing, has other buckets or went
    down is skipped for it alone (the next good poll counts from the base, and two odd
    polls in a row re-base it); the counters' confirmed restart is the only restart."""

    shape: tuple[float, ...] | None = None  # None: never seen
    base: tuple[float, ...] = ()
    total: tuple[float, ...] = ()
    pending: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    absent: bool = False
    restarted: bool = False  # the counters restarted since this series was last counted

    def step(self, shape: tuple[float, ...], values: tuple[float, ...] | None, restarted: bool, restarting: bool) -> str | None:
        """Fold one poll in; why it was not counted, when it was not and that is news."""
        self.restarted |= restarted
        if values is None:
            was_absent, self.absent = self.absent, True
            return None if was_absent or self.shape is None else "missing"
        self.absent = False
        if not all(map(math.isfinite, values)):  # adapters refuse these; never summed if one slips through
            return "not a finite value"
        if self.shape is None or self.restarted:
            # First seen (not an increment, as in increase()), or everything since the restart.
            self._rebase(shape, values, count=self.restarted)
            return None
        if shape == self.shape and all(a >= b for b, a in zip(self.base, values, strict=True)):
            self.total = tuple(t + a - b for t, b, a in zip(self.total, self.base, values, strict=True))
            self.base, self.pending = values, None
            return None
        odd = "other buckets" if shape != self.shape else "went down without a restart"
        if (
            self.pending is not None
            and self.pending[0] == shape
            and all(a >= b for b, a in zip(self.pending[1], values, strict=True))
        ):
            self._rebase(shape, values, count=self.restarted)  # two in a row: the new base, nothing added
            return f"{odd} twice in a row; counted from here"
        self.pending = (shape, values)
        return None if restarting else odd  # a restart's first poll: the counters tell it

    def _rebase(self, shape: tuple[float, ...], values: tuple[float, ...], count: bool) -> None:
        if shape != self.shape or len(self.total) != len(values):
            self.total = (0.0,) * len(values)
        if count:
            self.total = tuple(t + v for t, v in zip(self.total, values, strict=True))
        self.shape, self.base, self.pending, self.restarted = shape, values, None, False

    def reset_total(self) -> None:
        """The counters' running total started again (k changed): so does this one."""
        self.total = (0.0,) * len(self.total)


def _generation(c: Counters) -> tuple[tuple[float, ...], tuple[float, ...] | None]:
    return (), None if c.generation_tokens is None else (c.generation_tokens,)


def _histogram(c: Counters) -> tuple[tuple[float, ...], tuple[float, ...] | None]:
    h = c.request_acceptance
    return ((), None) if h is None else (h.edges, (*h.cumulative, h.count))


_PROCESSES_REMEMBERED = 4  # per engine: old and new replicas of a rollout, and a margin


@dataclass(slots=True)
class _Engine:
    base: Counters  # the last consistent values
    base_t: float
    total: Counters  # running total since we first saw it; never goes down (sides excluded)
    seen: float
    pending: Counters | None = None  # a restart or inconsistent poll waiting for the next one
    pending_kind: str = ""
    generation: _Side = field(default_factory=_Side)
    histogram: _Side = field(default_factory=_Side)
    # The last values counted of each process (by vLLM's _created) that answered as this engine,
    # the newest few: a replica seen before that answers again (two servers behind one URL, old
    # and new alternating in a rollout) adds what it did since, never its whole life again.
    counted: dict[float, Counters] = field(default_factory=dict)
    # A later start time with the counters gone on that the next poll took back (another server
    # answered): a restart when that start time answers again, as the next poll would have confirmed.
    held: Counters | None = None

    def seen_before(self, now: Counters) -> Counters | None:
        """The last values counted of the process ``now`` comes from (its start time, within the slack)."""
        return next((c for c in self.counted.values() if started_elsewhen(c, now) is False), None)

    def rebase(self, now: Counters, t: float) -> None:
        self.base, self.base_t = now, t
        if now.started is not None:
            for started in [s for s, c in self.counted.items() if started_elsewhen(c, now) is False]:
                del self.counted[started]
            self.counted[now.started] = now
            while len(self.counted) > _PROCESSES_REMEMBERED:
                del self.counted[next(iter(self.counted))]

    def totals(self) -> Counters:
        """The running total with its sides."""
        gen, hist = self.generation, self.histogram
        request_acceptance = None
        if hist.shape is not None:
            request_acceptance = RequestHistogram(hist.shape, hist.total[:-1], hist.total[-1])
        return replace(
            self.total, generation_tokens=gen.total[0] if gen.shape is not None else None, request_acceptance=request_acceptance
        )


class TargetHistory:
    def __init__(self, windows: Sequence[tuple[str, float]], forget_after: float):
        self._windows = tuple(windows)
        self._rings: dict[str, deque[HistorySample]] = {label: deque() for label, _ in windows}
        self._engines: dict[SeriesKey, _Engine] = {}
        self._forget_after = forget_after  # an engine unseen this long is dropped
        self.latest: HistorySample | None = None
        # Per model, one point per step of the longest window's ring, over that window.
        self.trend_window = max(self._windows, key=lambda w: w[1]) if self._windows else ("", 0.0)
        self._trends = Trends(self.trend_window[1])

    def held(self) -> int:
        return len(self._engines)

    def base(self, key: SeriesKey) -> Counters | None:
        """The engine's last consistent values (what a glitchy poll is replaced by)."""
        e = self._engines.get(key)
        return e.base if e is not None else None

    def seen(self) -> dict[SeriesKey, float]:
        """When each held engine was last seen (for ``admit``)."""
        return {k: e.seen for k, e in self._engines.items()}

    def last_poll(self) -> float | None:
        """When the last poll was read (for ``admit``), or None before the first."""
        return None if self.latest is None else self.latest.t

    def admit(
        self,
        raw: Mapping[SeriesKey, Counters],
        cap: int,
        max_models: int,
    ) -> tuple[dict[SeriesKey, Counters], int, list[SeriesKey]]:
        return admit(raw, self.seen(), cap, max_models, self.last_poll())

    def observe(self, t: float, raw: Mapping[SeriesKey, Counters], forget: Sequence[SeriesKey] = ()) -> Observation:
        first_poll = self.latest is None
        self._forget(forget)
        increments: dict[SeriesKey, Counters] = {}
        restarted: list[SeriesKey] = []
        appeared: list[SeriesKey] = []
        inconsistent: list[tuple[SeriesKey, str]] = []
        skipped: list[tuple[SeriesKey, str]] = []
        for key, now in raw.items():
            e = self._engines.get(key)
            if e is None:
                # Counted before we watched it (at start-up, or an engine seen for the
                # first time or again after being forgotten): its running total starts
                # here. As in Prometheus's increase(), a new series' first value is not
                # an increment: counting it could add an engine's whole lifetime to a
                # window, while skipping it loses at most one poll interval.
                e = self._engines[key] = _Engine(now, t, _zero(now.k), t)
                e.rebase(now, t)
                self._step_sides(e, key, now, False, False, skipped)
                if not first_poll:
                    appeared.append(key)
                continue
            e.seen = t
            confirmed = False
            if e.pending is not None and e.pending_kind == GREW_PAST and started_elsewhen(e.pending, now) is False:
                # Its start time kept by this poll: a restart, whatever the counters did since (judged below).
                confirmed = True
                restarted.append(key)
                self._add(e, key, e.pending, increments)
                e.rebase(e.pending, t)
                e.pending, e.pending_kind = None, ""
            verdict = classify(e.base, now, t - e.base_t)
            pending, kind = e.pending, e.pending_kind
            e.pending, e.pending_kind = None, ""
            # Grown past the last reading (the one waiting to be kept, if any): a restart once a later poll
            # keeps its start time (one stamped at each scrape never is), or at once if held before.
            last = pending if pending is not None and kind == GREW_PAST else e.base
            grew = verdict == STARTED_AGAIN and now.drafts >= last.drafts
            # A process counted before (the base's own is one, but its verdict is not CONSISTENT).
            earlier = e.seen_before(now)
            held = (
                e.held is not None
                and started_elsewhen(e.held, now) is False
                and classify(e.held, now, t - e.base_t) == CONSISTENT
            )
            if verdict == CONSISTENT:
                if pending is not None and kind in (RESTART, GREW_PAST):
                    inconsistent.append((key, "a restart the next poll took back (two servers behind one URL?)"))
                    e.held = pending if kind == GREW_PAST else e.held
                self._add(e, key, difference(e.base, now), increments)
                e.rebase(now, t)
            elif earlier is not None and classify(earlier, now, t - e.base_t) == CONSISTENT:
                # A process counted before answers again: what it did since, and said (not a restart).
                # Its generation tokens and histogram start from here (one poll's worth lost).
                inconsistent.append((key, "a server seen before answers again (two servers behind one URL?)"))
                self._add(e, key, difference(earlier, now), increments)
                e.rebase(now, t)
                self._rebase_sides(e, now)
                continue
            elif (verdict == STARTED_AGAIN and (not grew or held)) or (
                pending is not None and kind == RESTART and classify(pending, now, t - e.base_t) == CONSISTENT
            ):
                # A restart known from the start time (_created), or one the next poll confirmed: all of it new.
                confirmed = True
                restarted.append(key)
                self._add(e, key, now, increments)
                e.rebase(now, t)
                e.held = None if held else e.held
            elif pending is not None and grew:
                # Another later start time, the last not kept: said; this one waits in its turn to be kept.
                inconsistent.append((key, MOVING_START))
                e.pending, e.pending_kind = now, GREW_PAST
                continue
            elif pending is not None:
                # Two odd polls in a row: this one is the new base, nothing is added.
                inconsistent.append((key, verdict if verdict != RESTART else kind))
                if now.k != e.total.k:
                    self._new_total(e, now.k)
                e.rebase(now, t)
            else:
                e.pending, e.pending_kind = now, GREW_PAST if grew else verdict
                if e.pending_kind not in (RESTART, GREW_PAST):
                    inconsistent.append((key, verdict))
                if grew:  # its sides wait too: a confirmed restart counts them whole
                    continue
            self._step_sides(e, key, now, confirmed, verdict == RESTART and pending is None, skipped)
        self._forget([k for k, e in self._engines.items() if t - e.seen > self._forget_after])

        sample = HistorySample(t, {k: e.totals() for k, e in self._engines.items()})
        self.latest = sample
        for label, seconds in self._windows:
            ring = self._rings[label]
            if not ring or t - ring[-1].t >= seconds / config.WINDOW_RESOLUTION:
                if label == self.trend_window[0] and ring:
                    self._trends.step(ring[-1].totals, sample.totals, t)
                ring.append(sample)
            # Keep exactly one sample at or before the window's start.
            while len(ring) >= 2 and ring[1].t <= t - seconds:
                ring.popleft()
        return Observation(increments, tuple(restarted), tuple(appeared), tuple(inconsistent), tuple(skipped))

    def _forget(self, keys: Sequence[SeriesKey]) -> None:
        """Engines dropped, and their running totals from the samples the windows start at: seen
        again, an engine's total starts at 0, and against its old one a window read its return as
        a restart until the new total passed the old, then subtracted the old (2,000 drafts a
        poll read 200: helper-39). Without it, the window counts it as new from its return."""
        gone = [key for key in keys if self._engines.pop(key, None) is not None]
        if gone:
            for sample in {id(s): s for ring in self._rings.values() for s in ring}.values():
                for key in gone:
                    sample.totals.pop(key, None)

    @staticmethod
    def _rebase_sides(e: _Engine, now: Counters) -> None:
        """The series beside the counters start again from ``now``, nothing counted."""
        for side, read in ((e.generation, _generation), (e.histogram, _histogram)):
            if (values := read(now))[1] is not None:
                side._rebase(values[0], values[1], count=False)

    @staticmethod
    def _add(e: _Engine, key: SeriesKey, inc: Counters, increments: dict[SeriesKey, Counters]) -> None:
        # A restart confirmed and the poll after it: both in one poll's increment.
        increments[key] = sum_counters([increments[key], inc]) if key in increments and increments[key].k == inc.k else inc
        # k only changes across a restart (or from a lazy producer's empty k=0); a
        # new running total makes the window difference treat it as one
        # (restarts.delta: classify reads a changed k as no interval).
        total = align_k(e.total, inc)
        if total.k != inc.k:
            TargetHistory._new_total(e, inc.k)
            total = e.total
        e.total = sum_counters([total, replace(inc, generation_tokens=None, request_acceptance=None)])

    @staticmethod
    def _new_total(e: _Engine, k: int) -> None:
        e.total = _zero(k)
        e.generation.reset_total()
        e.histogram.reset_total()

    @staticmethod
    def _step_sides(
        e: _Engine, key: SeriesKey, now: Counters, restarted: bool, restarting: bool, skipped: list[tuple[SeriesKey, str]]
    ) -> None:
        for name, side, read in (
            ("generation tokens", e.generation, _generation),
            ("per-request histogram", e.histogram, _histogram),
        ):
            if (why := side.step(*read(now), restarted, restarting)) is not None:
                skipped.append((key, f"{name}: {why}"))

    def trends(self) -> dict[str, tuple[TrendPoint, ...]]:
        """Each model's trend over the longest window (``Trends.read``: read it in the poller's
        views thread, not on the loop)."""
        return self._trends.read()

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


def _zero(k: int) -> Counters:
    return Counters(0.0, 0.0, 0.0, (0.0,) * k)
