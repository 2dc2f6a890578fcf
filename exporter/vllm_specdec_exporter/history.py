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
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from . import config
from .derive import align_k, delta, histogram_pairs, sum_counters
from .model import Counters, RequestHistogram, SeriesKey

Totals = Mapping[SeriesKey, Counters]

RESTART = "restart"
CONSISTENT = "consistent"


@dataclass(frozen=True, slots=True)
class HistorySample:
    t: float  # monotonic seconds
    totals: Totals


@dataclass(frozen=True, slots=True)
class Observation:
    """What one poll added: per-engine increments, and which engines restarted,
    appeared, or were inconsistent (with the reason, a fixed phrase)."""

    increments: dict[SeriesKey, Counters]
    restarted: tuple[SeriesKey, ...]
    appeared: tuple[SeriesKey, ...]
    inconsistent: tuple[tuple[SeriesKey, str], ...] = ()


@dataclass(frozen=True, slots=True)
class WindowDelta:
    span_seconds: float
    engines: dict[SeriesKey, Counters]


def _series(c: Counters) -> list[float]:
    return [c.drafts, c.draft_tokens, c.accepted, *c.per_position]


def classify(base: Counters, now: Counters, seconds: float) -> str:
    """CONSISTENT, RESTART, or why the poll is inconsistent (a fixed phrase)."""
    base = align_k(base, now)
    totals_down = now.drafts < base.drafts and now.draft_tokens < base.draft_tokens and now.accepted < base.accepted
    if totals_down:
        if now.drafts > config.MAX_DRAFTS_PER_SECOND * max(seconds, 1.0):
            return "counters went down, but not to near zero (another server's values?)"
        return RESTART
    if now.k != base.k:
        return "k changed without a restart (positions cut off or added)"
    pairs = list(zip(_series(base), _series(now), strict=True))
    if base.generation_tokens is not None and now.generation_tokens is not None:
        pairs.append((base.generation_tokens, now.generation_tokens))
    pairs += histogram_pairs(base.request_acceptance, now.request_acceptance)
    if any(a < b for b, a in pairs):
        return "only some counters went down"
    if now.drafts - base.drafts > config.MAX_DRAFTS_PER_SECOND * max(seconds, 1.0):
        return "drafts grew faster than any engine can (another server's values?)"
    return CONSISTENT


@dataclass(slots=True)
class _Engine:
    base: Counters  # the last consistent values
    base_t: float
    total: Counters  # running total since we first saw it; never goes down
    seen: float
    pending: Counters | None = None  # a restart or inconsistent poll waiting for the next one
    pending_kind: str = ""


class TargetHistory:
    def __init__(self, windows: Sequence[tuple[str, float]], forget_after: float):
        self._windows = tuple(windows)
        self._rings: dict[str, deque[HistorySample]] = {label: deque() for label, _ in windows}
        self._engines: dict[SeriesKey, _Engine] = {}
        self._forget_after = forget_after  # an engine unseen this long is dropped
        self.latest: HistorySample | None = None

    def held(self) -> int:
        return len(self._engines)

    def base(self, key: SeriesKey) -> Counters | None:
        """The engine's last consistent values (what a glitchy poll is replaced by)."""
        e = self._engines.get(key)
        return e.base if e is not None else None

    def seen(self) -> dict[SeriesKey, float]:
        """When each held engine was last seen (for ``admit``)."""
        return {k: e.seen for k, e in self._engines.items()}

    def admit(self, raw: Mapping[SeriesKey, Counters], cap: int, max_models: int,
              ) -> tuple[dict[SeriesKey, Counters], int, list[SeriesKey]]:
        return admit(raw, self.seen(), cap, max_models)

    def observe(self, t: float, raw: Mapping[SeriesKey, Counters], forget: Sequence[SeriesKey] = ()) -> Observation:
        first_poll = self.latest is None
        for key in forget:
            self._engines.pop(key, None)
        increments: dict[SeriesKey, Counters] = {}
        restarted, appeared, inconsistent = [], [], []
        for key, now in raw.items():
            e = self._engines.get(key)
            if e is None:
                # Counted before we watched it (at start-up, or an engine seen for the
                # first time or again after being forgotten): its running total starts
                # here. As in Prometheus's increase(), a new series' first value is not
                # an increment: counting it could add an engine's whole lifetime to a
                # window, while skipping it loses at most one poll interval.
                self._engines[key] = _Engine(now, t, _zero(now.k, now.generation_tokens is not None, now.request_acceptance), t)
                if not first_poll:
                    appeared.append(key)
                continue
            e.seen = t
            verdict = classify(e.base, now, t - e.base_t)
            pending, kind = e.pending, e.pending_kind
            e.pending, e.pending_kind = None, ""
            if verdict == CONSISTENT:
                if pending is not None and kind == RESTART:
                    inconsistent.append((key, "a restart the next poll took back (two servers behind one URL?)"))
                self._add(e, key, delta(e.base, now)[0], increments)
                e.base, e.base_t = now, t
            elif pending is not None and kind == RESTART and classify(pending, now, t - e.base_t) == CONSISTENT:
                # The restart is confirmed: everything counted since it is new.
                restarted.append(key)
                self._add(e, key, now, increments)
                e.base, e.base_t = now, t
            elif pending is not None:
                # Two odd polls in a row: this one is the new base, nothing is added.
                inconsistent.append((key, verdict if verdict != RESTART else kind))
                if now.k != e.total.k:
                    e.total = _zero(now.k, now.generation_tokens is not None, now.request_acceptance)
                e.base, e.base_t = now, t
            else:
                e.pending, e.pending_kind = now, verdict
                if verdict != RESTART:
                    inconsistent.append((key, verdict))
        for key in [k for k, e in self._engines.items() if t - e.seen > self._forget_after]:
            del self._engines[key]

        sample = HistorySample(t, {k: e.total for k, e in self._engines.items()})
        self.latest = sample
        for label, seconds in self._windows:
            ring = self._rings[label]
            if not ring or t - ring[-1].t >= seconds / config.WINDOW_RESOLUTION:
                ring.append(sample)
            # Keep exactly one sample at or before the window's start.
            while len(ring) >= 2 and ring[1].t <= t - seconds:
                ring.popleft()
        return Observation(increments, tuple(restarted), tuple(appeared), tuple(inconsistent))

    @staticmethod
    def _add(e: _Engine, key: SeriesKey, inc: Counters, increments: dict[SeriesKey, Counters]) -> None:

        increments[key] = inc
        # k only changes across a restart (or from a lazy producer's empty k=0); a
        # new running total makes the window difference treat it as one
        # (derive.delta compares k).
        total = align_k(e.total, inc)
        if inc.request_acceptance is not None and not histogram_pairs(total.request_acceptance, inc.request_acceptance):
            # The histogram appeared (or its buckets changed): its running total starts here.
            total = replace(total, request_acceptance=_zero(0, False, inc.request_acceptance).request_acceptance)
        e.total = inc if total.k != inc.k else sum_counters([total, inc])

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


def admit(raw: Mapping[SeriesKey, Counters], held: Mapping[SeriesKey, float], cap: int, max_models: int,
          ) -> tuple[dict[SeriesKey, Counters], int, list[SeriesKey]]:
    """Which of a poll's engines may be held: (kept, refused count, engines to forget).

    ``held`` maps each engine held to when it was last seen. Engines already held come
    first; a new one takes the place of the held engine unseen the longest, and is
    refused when every held engine is still served. Pure: runs in the parsing process.
    """
    kept: dict[SeriesKey, Counters] = {}
    for key in sorted(k for k in raw if k in held)[:cap]:
        kept[key] = raw[key]
    refused = sum(1 for k in raw if k in held) - len(kept)
    models = {m for m, _ in kept}
    absent = sorted((k for k in held if k not in raw), key=lambda k: held[k], reverse=True)
    room = cap - len(kept) - len(absent)
    forget: list[SeriesKey] = []
    for key in sorted(k for k in raw if k not in held):
        if key[0] not in models and len(models) >= max_models:
            refused += 1
            continue
        if room <= 0:
            if not absent:
                refused += 1
                continue
            forget.append(absent.pop())  # the one unseen the longest
            room += 1
        kept[key] = raw[key]
        models.add(key[0])
        room -= 1
    return kept, refused, forget


def _zero(k: int, with_generation: bool, histogram: RequestHistogram | None = None) -> Counters:
    zero = None if histogram is None else RequestHistogram(histogram.edges, (0.0,) * len(histogram.edges), 0.0)
    return Counters(0.0, 0.0, 0.0, (0.0,) * k, 0.0 if with_generation else None, zero)
