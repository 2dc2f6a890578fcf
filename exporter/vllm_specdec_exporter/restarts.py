"""The one reading of two readings of an engine (README "A glitch is not a restart"):
consistent, a restart (known from vLLM's _created, or inferred from every total gone
down), or no interval at all, with the reason; and what accrued between them. The
sidecar's polls (history.py) and diff's dumps (cli.py) both read pairs here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from . import config
from .model import Counters, RequestHistogram, SeriesKey


def align_k(before: Counters, after: Counters) -> Counters:
    """``before`` with k zero positions when it had no positions and no drafts yet.

    Producers that create the per-position series lazily (llama.cpp, vLLM's Rust
    frontend) show k=0 until the first speculative step ends; with nothing drafted
    yet that is the same as k zeros, so k growing from there is plain growth.
    """
    if before.k == 0 < after.k and before.drafts == before.draft_tokens == before.accepted == 0:
        return replace(before, per_position=(0.0,) * after.k)
    return before


RESTART = "restart"
STARTED_AGAIN = "started again"  # a restart known from the engine's start time (_created), not inferred
CONSISTENT = "consistent"
WENT_DOWN = "counters went down"  # a restart's warning starts with it after the engine (cli's diff drops them)
DOWN_A_LITTLE = "counters went down a little, not to near zero (a glitch?)"  # without a start time: not a restart


def _series(c: Counters) -> list[float]:
    return [c.drafts, c.draft_tokens, c.accepted, *c.per_position]


def started_elsewhen(base: Counters, now: Counters) -> bool | None:
    """Whether the two readings come from processes started at different times (None: a
    start time is unknown); closer than START_TIME_SLACK_SECONDS is the same start."""
    if base.started is None or now.started is None:
        return None
    return abs(now.started - base.started) >= config.START_TIME_SLACK_SECONDS


def classify(base: Counters, now: Counters, seconds: float) -> str:
    """CONSISTENT, RESTART, or why the pair is inconsistent (a fixed phrase): the one reading
    of two samples of an engine, for the sidecar's polls (history.py) and diff's dumps
    (``seconds`` infinite when unknown). README "A glitch is not a restart".

    Where both readings carry the engine's start time (vLLM's _created), it decides: a later
    one is a restart (STARTED_AGAIN) whatever the counters did, even when they grew past the
    last reading, unless no engine started since could have drafted that much (a start time
    stamped at each scrape would add the engine's whole life to every window); an earlier one
    is another, older server; the same one with counters gone down is a glitch. Without it, the
    counters alone tell, as before."""
    if started_elsewhen(base, now):
        assert base.started is not None and now.started is not None
        if now.started < base.started:
            return "an engine that started earlier answers (two servers behind one URL?)"
        if now.drafts > config.MAX_DRAFTS_PER_SECOND * max(seconds, 1.0):
            return "a later start time, but more drafts than an engine started since could make (a start time stamped at each scrape?)"
        return STARTED_AGAIN
    base = align_k(base, now)
    # A total at 0 (a head that never accepted) cannot go down: it does not vote against a restart.
    totals_down = (
        now.drafts < base.drafts and now.draft_tokens < base.draft_tokens and (now.accepted < base.accepted or base.accepted == 0)
    )
    if totals_down:
        if started_elsewhen(base, now) is False:
            return "counters went down, but the engine did not restart (its _created is unchanged): swapped dumps, or a glitch"
        if now.drafts > config.MAX_DRAFTS_PER_SECOND * max(seconds, 1.0):
            return "counters went down, but not to near zero (another server's values?)"
        if now.drafts > config.RESTART_MAX_SHARE * base.drafts:
            return DOWN_A_LITTLE
        return RESTART
    if now.k != base.k:
        return "k changed without a restart (positions cut off or added)"
    # Generation tokens and the histogram are not compared here: each has its own _Side.
    if any(a < b for b, a in zip(_series(base), _series(now), strict=True)):
        return "only some counters went down"
    if now.drafts - base.drafts > config.MAX_DRAFTS_PER_SECOND * max(seconds, 1.0):
        return "drafts grew faster than any engine can (another server's values?)"
    return CONSISTENT


def histogram_pairs(before: RequestHistogram | None, after: RequestHistogram | None) -> list[tuple[float, float]]:
    """(before, after) of each per-request histogram series, when both have the same buckets."""
    if before is None or after is None or before.edges != after.edges:
        return []
    return [*zip(before.cumulative, after.cumulative, strict=True), (before.count, after.count)]


def _histogram_delta(before: RequestHistogram | None, after: RequestHistogram | None) -> RequestHistogram | None:
    # Not comparable (absent on one side, the buckets changed, or a series went down
    # while the counters did not): no figure, never a guess.
    pairs = histogram_pairs(before, after)
    if not pairs or any(a < b for b, a in pairs):
        return None
    assert before is not None and after is not None
    return RequestHistogram(
        after.edges, tuple(a - b for b, a in zip(before.cumulative, after.cumulative, strict=True)), after.count - before.count
    )


def delta(before: Counters | None, after: Counters) -> tuple[Counters, bool]:
    """Counters accrued between two readings of one engine, and whether it restarted.

    The restart is ``classify``'s (the one reading of two samples): any reading of the pair
    but CONSISTENT (counters gone down, k changed, a later start time) counts every delta
    from the new value, since taking per-series differences would undercount a series that
    had climbed past its old value since the restart. An engine absent before started in
    between. (The history's running totals carry no start time and never go down but when
    they start again, at a new k or an engine seen again: that is the restart they read.)
    """
    if before is None:
        return after, False
    if classify(before, after, math.inf) != CONSISTENT:
        return after, True
    return difference(before, after), False


def difference(before: Counters, after: Counters) -> Counters:
    """Counters accrued between two readings of one engine that ``classify`` reads as
    CONSISTENT (per-series differences; ``before`` with k zero positions where it had none)."""
    before = align_k(before, after)
    generation = None
    if (
        before.generation_tokens is not None
        and after.generation_tokens is not None
        and after.generation_tokens >= before.generation_tokens
    ):
        generation = after.generation_tokens - before.generation_tokens
    return Counters(
        drafts=after.drafts - before.drafts,
        draft_tokens=after.draft_tokens - before.draft_tokens,
        accepted=after.accepted - before.accepted,
        per_position=tuple(a - b for b, a in zip(before.per_position, after.per_position, strict=True)),
        generation_tokens=generation,
        request_acceptance=_histogram_delta(before.request_acceptance, after.request_acceptance),
    )


@dataclass(frozen=True, slots=True)
class EngineDeltas:
    counters: dict[SeriesKey, Counters]
    restarted: tuple[SeriesKey, ...]
    warnings: tuple[str, ...]
    refused: tuple[tuple[SeriesKey, str], ...] = ()  # pairs that are no interval, with the reason


def delta_engines(
    before: Mapping[SeriesKey, Counters],
    after: Mapping[SeriesKey, Counters],
    describe: Callable[[SeriesKey], str] = str,
    seconds: float | None = None,
) -> EngineDeltas:
    """Per-engine deltas between two scrapes, read as the sidecar reads two polls
    (``classify``): a restart (every total went down) counts from zero; a pair no engine
    could produce (only some counters went down, k changed without a restart) is left out
    with its reason, never read as the engine's lifetime."""
    counters: dict[SeriesKey, Counters] = {}
    restarted: list[SeriesKey] = []
    refused: list[tuple[SeriesKey, str]] = []
    warnings: list[str] = []
    for key, now in after.items():
        prev = before.get(key)
        if prev is None:
            counters[key] = now
            warnings.append(f"{describe(key)}: not in the first scrape; counted from zero")
            continue
        verdict = classify(prev, now, math.inf if seconds is None else seconds)
        if verdict == CONSISTENT:
            counters[key] = difference(prev, now)
        elif verdict in (RESTART, STARTED_AGAIN):
            counters[key] = now
            restarted.append(key)
            changed_k = f", k {prev.k} -> {now.k}" if prev.k != now.k else ""
            if verdict == RESTART:
                warnings.append(f"{describe(key)}: {WENT_DOWN} (restart{changed_k}); counted from zero")
            else:
                warnings.append(
                    f"{describe(key)}: restarted between the scrapes (its counters started again at "
                    f"{_utc(now.started)}{changed_k}); counted from the restart"
                )
        else:
            refused.append((key, verdict))
            warnings.append(f"{describe(key)}: not an interval ({verdict}); left out")
    for key in (k for k in before if k not in after):  # in the dump's order: the same output every run
        warnings.append(f"{describe(key)}: in the first scrape only; left out")
    return EngineDeltas(counters, tuple(restarted), tuple(warnings), tuple(refused))


def _utc(started: float | None) -> str:
    """A start time (vLLM's _created) as UTC, to the second."""
    import datetime

    if started is None or not math.isfinite(started) or not 0 <= started < 1e11:
        return "an unknown time"
    return datetime.datetime.fromtimestamp(started, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
