"""The typed snapshot every producer adapter produces and the math consumes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Counters:
    """Cumulative (or delta) speculative-decoding counters of one engine.

    ``per_position[i]`` counts drafts in which at least i+1 tokens were accepted,
    so ``len(per_position)`` is k. ``generation_tokens`` is None when the producer
    does not expose it (absent, not zero).
    """

    drafts: float
    draft_tokens: float
    accepted: float
    per_position: tuple[float, ...]
    generation_tokens: float | None = None

    @property
    def k(self) -> int:
        return len(self.per_position)


# (model_name, engine): vLLM's engine label is the global data-parallel rank.
SeriesKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One scrape, reduced to spec-decode counters per (model_name, engine).

    Produced only when the producer's spec-decode families are present: "spec
    decode is off" is an error raised by the adapter layer, never an empty or
    all-zero snapshot.
    """

    producer: str
    engines: Mapping[SeriesKey, Counters]
    warnings: tuple[str, ...] = field(default=())
    malformed_lines: int = 0
    duplicate_series: int = 0
    # Figures that are estimates, not exact (SGLang: from finished-request totals).
    approximate: tuple[str, ...] = field(default=())
    impossible_values: int = 0  # negative, non-finite or > MAX_COUNTER_VALUE: refused, counted as violations
