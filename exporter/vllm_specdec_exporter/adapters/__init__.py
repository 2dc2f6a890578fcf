"""Producer adapters: parsed families -> typed Snapshot.

One module per producer, each exposing adapters with the sample names they read
(``families``), the ones whose presence means "spec decode on" (``spec_families``),
``detect()`` and ``snapshot()`` (None when its families are absent). The producer
is the one with the most of its spec-decode families present (``ranked``: one stray
family of another producer never flips a payload), on a tie the first in ``ADAPTERS``
order (vLLM V0 before V1: they share counter names; Dynamo before the bare engine:
it only adds labels, and counts only samples carrying them), or named by the caller
(a target's ``producer:``). Another producer's spec-decode families beside the
chosen one's are named in a warning.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from .. import config
from ..model import SeriesKey, Snapshot
from ..parser import Exposition, ParseError, SeriesCache, parse
from . import dynamo, llamacpp, lmdeploy, ray_serve, sglang, trtllm, vllm_v0, vllm_v1
from .common import UnsupportedProducer, families_present

__all__ = ["ADAPTERS", "PRODUCERS", "NoSpecDecodeFamilies", "UnsupportedProducer", "detect", "extract"]


class Adapter(Protocol):
    # Read-only, so an adapter's class-level tuples (of a fixed length) conform.
    @property
    def name(self) -> str: ...

    @property
    def families(self) -> tuple[str, ...]: ...  # every sample name it reads

    @property
    def spec_families(self) -> tuple[str, ...]: ...  # the ones whose presence means "spec decode on"

    def snapshot(self, exp: Exposition) -> Snapshot | None: ...

    def generation_tokens(self, exp: Exposition) -> dict[SeriesKey, float]: ...


ADAPTERS: tuple[Adapter, ...] = (
    vllm_v0.ADAPTER,
    dynamo.VLLM,
    vllm_v1.ADAPTER,
    ray_serve.ADAPTER,
    llamacpp.ADAPTER,
    lmdeploy.ADAPTER,
    dynamo.TRTLLM,
    trtllm.ADAPTER,
    dynamo.SGLANG,
    sglang.ADAPTER,
)
BY_NAME: dict[str, Adapter] = {a.name: a for a in ADAPTERS}
PRODUCERS: tuple[str, ...] = tuple(BY_NAME)
WANTED: frozenset[str] = frozenset(name for a in ADAPTERS for name in a.families)


def _score(adapter: Adapter, exp: Exposition) -> int:
    """How many of the adapter's spec-decode families are present."""
    score = getattr(adapter, "score", None)
    return score(exp) if score else families_present(exp, adapter.spec_families)


def ranked(exp: Exposition) -> tuple[Adapter, ...]:
    """The adapters whose spec-decode families are present, the most families first
    (``ADAPTERS`` order on a tie). Every adapter asked in full: ~50 us a poll (a second,
    name-only count saved ~30 us, 1 % of a DP=8 poll, and was removed: docs/performance.md)."""
    scored = [(-score, adapter) for adapter in ADAPTERS if (score := _score(adapter, exp))]
    scored.sort(key=lambda pair: pair[0])  # stable: ADAPTERS order on a tie
    return tuple(adapter for _, adapter in scored)


def detect(exp: Exposition) -> str | None:
    """The producer with the most of its spec-decode families present, or None."""
    return next((a.name for a in ranked(exp)), None)


def _also_present(exp: Exposition, chosen: Adapter, others: tuple[Adapter, ...]) -> tuple[str, ...]:
    """A warning per other producer whose spec-decode families the chosen one does not read."""
    warnings, named = [], set(chosen.families)
    for other in others:
        extra = [n for n in other.spec_families if exp.samples.get(n) and n not in named]
        if extra:
            named.update(extra)
            warnings.append(
                f"the payload also has producer {other.name}'s spec-decode families ({', '.join(extra)}; "
                f"{_score(other, exp)} of its {len(other.spec_families)}); read as {chosen.name} "
                f"({_score(chosen, exp)} of its {len(chosen.spec_families)}): if that is wrong, name the "
                "producer (a target's producer:, --producer)"
            )
    return tuple(warnings)


class NoSpecDecodeFamilies(ParseError):
    """Spec decode is off (its families are absent), which is not zero. ``generation``
    still carries the generation-token counters, so "generating without drafting"
    stays visible."""

    def __init__(
        self,
        generation: dict[SeriesKey, float] | None = None,
        adapters: tuple[Adapter, ...] = ADAPTERS,
        detected: str | None = None,
    ) -> None:
        # vLLM V1's families in full, one per other producer (the line stays readable).
        names = [n for a in adapters for n in (a.spec_families if a is vllm_v1.ADAPTER else a.spec_families[:1])]
        looked_for = ", ".join(dict.fromkeys(names))
        hint = f"; the families present are producer {detected!r}'s" if detected else ""
        super().__init__(f"no speculative-decoding families found (looked for {looked_for}){hint}; is spec decode enabled?")
        self.generation = generation or {}


def extract(
    data: bytes | str,
    max_bytes: int = config.DEFAULT_MAX_PAYLOAD_BYTES,
    producer: str | None = None,
    *,
    cache: SeriesCache | None = None,
    max_samples: int | None = None,
) -> Snapshot:
    """Parse a /metrics payload and read it with the named producer's adapter, or
    the detected one. Raises UnsupportedProducer for a producer that is refused.
    ``cache`` and ``max_samples``: see parser.parse."""
    if producer is not None and producer not in BY_NAME:
        raise ValueError(f"unknown producer {producer!r} (known: {', '.join(PRODUCERS)})")
    if producer:
        candidates: tuple[Adapter, ...] = (BY_NAME[producer],)
        exp = parse(data, candidates[0].families, max_bytes, cache=cache, max_samples=max_samples)
    else:
        exp = parse(data, WANTED, max_bytes, cache=cache, max_samples=max_samples)
        candidates = ranked(exp)
    for adapter in candidates:
        snap = adapter.snapshot(exp)
        if snap is not None:
            also = () if producer else _also_present(exp, adapter, tuple(a for a in candidates if a is not adapter))
            return replace(snap, warnings=snap.warnings + also) if also else snap
    generation = next((g for a in (candidates or ADAPTERS) if (g := a.generation_tokens(exp))), {})
    # Named the payload's producer, or another one: say which the families belong to.
    seen = detect(parse(data, WANTED, max_bytes, max_samples=max_samples) if producer else exp)
    raise NoSpecDecodeFamilies(generation, candidates if producer else ADAPTERS, seen)
