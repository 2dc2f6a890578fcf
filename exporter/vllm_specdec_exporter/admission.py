"""Which of a poll's engines a target's history may hold: a bounded number, the held ones
first, new ones in turn by model, a place given up only by an engine missing twice in a row."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import zip_longest

from .model import Counters, SeriesKey


def admit(
    raw: Mapping[SeriesKey, Counters],
    held: Mapping[SeriesKey, float],
    cap: int,
    max_models: int,
    last_poll: float | None = None,
) -> tuple[dict[SeriesKey, Counters], int, list[SeriesKey]]:
    """Which of a poll's engines may be held: (kept, refused count, engines to forget).
    ``last_poll``: when the last poll was read (None before the first: nothing is held).

    ``held`` maps each engine held to when it was last seen. Engines already held come
    first; a new one takes the place of the held engine unseen the longest among those
    missing from two polls in a row, and is refused when there is none. Pure: runs in
    the parsing process.
    """
    kept: dict[SeriesKey, Counters] = {}
    for key in sorted(k for k in raw if k in held)[:cap]:
        kept[key] = raw[key]
    refused = sum(1 for k in raw if k in held) - len(kept)
    models = {m for m, _ in kept}
    # A held engine missing from this poll gives up its place only if it was also missing
    # from the last poll (last seen before ``last_poll``): one cut poll (a truncated payload
    # with new engines in it) evicted a healthy target's engines for good (issue 29 item 8).
    # As for a counter, one odd poll changes nothing and a second in a row does. Until then
    # new engines are refused; an engine missing from every poll is forgotten after
    # forget_after (TargetHistory.observe).
    absent = [k for k in held if k not in raw]
    replaceable = sorted(
        (k for k in absent if last_poll is not None and held[k] < last_poll), key=lambda k: held[k], reverse=True
    )
    room = cap - len(kept) - len(absent)
    forget: list[SeriesKey] = []
    for key in _interleaved(k for k in raw if k not in held):
        if key[0] not in models and len(models) >= max_models:
            refused += 1
            continue
        if room <= 0:
            if not replaceable:
                refused += 1
                continue
            forget.append(replaceable.pop())  # the one unseen the longest
            room += 1
        kept[key] = raw[key]
        models.add(key[0])
        room -= 1
    return kept, refused, forget


def _interleaved(keys: Iterable[SeriesKey]) -> list[SeriesKey]:
    """New engines in turn by model (each model's first engine, then each one's second...):
    a model with thousands of engine labels cannot take every free slot from the others."""
    by_model: dict[str, list[SeriesKey]] = {}
    for key in sorted(keys):
        by_model.setdefault(key[0], []).append(key)
    rounds = zip_longest(*by_model.values())
    return [key for batch in rounds for key in batch if key is not None]
