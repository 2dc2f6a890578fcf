"""The typed snapshot every producer adapter produces and the math consumes."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from . import config
from .parser import format_series


@dataclass(frozen=True, slots=True)
class RequestHistogram:
    """vLLM's per-request acceptance histogram (PR #44487) of one engine: finished
    requests with acceptance <= each finite bucket edge (cumulative), and all of them."""

    edges: tuple[float, ...]
    cumulative: tuple[float, ...]
    count: float


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
    # Only when the producer exposes it (vLLM with PR #44487); None otherwise.
    request_acceptance: RequestHistogram | None = None
    # Cumulative counters only: when the engine's counters started (unix seconds, vLLM's
    # _created), where exposed; None for deltas and sums, and in multiprocess mode.
    started: float | None = None

    @property
    def k(self) -> int:
        return len(self.per_position)


# (model_name, engine): vLLM's engine label is the global data-parallel rank.
SeriesKey = tuple[str, str]


def engine_order(engine: str) -> tuple[int, int, str]:
    """Numeric ranks in numeric order (2 before 10), any other string after.

    Label values are arbitrary strings: only short ASCII digit strings are read as
    numbers (str.isdigit() accepts '²', which int() refuses, and int() refuses
    more than 4,300 digits).
    """
    if engine.isascii() and engine.isdigit() and len(engine) <= 18:
        return (0, int(engine), "")
    return (1, 0, engine)


def series_name(key: SeriesKey) -> str:
    """How warnings name one engine's series: model_name="...",engine="..." (any producer)."""
    return format_series("", {config.LABEL_MODEL: key[0], config.LABEL_ENGINE: key[1]}).strip("{}")


def speculative_method(name: str) -> str:
    """A speculative method as vLLM runs it: case aside, and its per-model MTP names (deepseek_mtp,
    qwen3_next_mtp, ...: deprecated aliases vLLM rewrites to mtp, with a warning) as mtp."""
    method = name.strip().lower()
    return "mtp" if method.endswith("_mtp") else method


@dataclass(frozen=True, slots=True)
class BaselineProfile:
    """The lowest healthy mean acceptance length of a model at one k (the settings package loads them)."""

    name: str
    model: re.Pattern[str]

    k: int
    mean_acceptance_length: float
    method: str | None = None

    def fits(self, k: int, method: str | None) -> bool:
        # vLLM does not expose the method: a target that does not declare one
        # matches on model and k alone.
        return self.k == k and (self.method is None or method is None or self.method == method)

    def matches(self, model_name: str, k: int, method: str | None) -> bool:
        # The name is the target's choice: capped, and the pattern was checked at load
        # (_safe_pattern), so matching cannot backtrack for long.
        return self.fits(k, method) and len(model_name) <= config.MAX_LABEL_VALUE_LENGTH and bool(self.model.search(model_name))


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
    # The name the per-request histogram was read under (config.VLLM_V1_REQUEST_ACCEPTANCE_NAMES).
    request_acceptance_family: str | None = None
