"""Producer adapters: parsed families -> typed Snapshot.

One module per producer, each exposing adapters with the sample names they read
(``families``), the ones whose presence means "spec decode on" (``spec_families``),
``detect()`` and ``snapshot()`` (None when its families are absent). The producer
is detected from the families present, in ``ADAPTERS`` order (vLLM V0 before V1:
they share counter names; Dynamo before the bare engine: it only adds labels), or
named by the caller (a target's ``producer:``).
"""

from __future__ import annotations

from typing import Protocol

from .. import config
from ..model import SeriesKey, Snapshot
from ..parser import Exposition, ParseError, parse
from . import dynamo, llamacpp, lmdeploy, ray_serve, sglang, trtllm, vllm_v0, vllm_v1
from .common import UnsupportedProducer, present

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
    vllm_v0.ADAPTER, dynamo.VLLM, vllm_v1.ADAPTER, ray_serve.ADAPTER, llamacpp.ADAPTER, lmdeploy.ADAPTER,
    dynamo.TRTLLM, trtllm.ADAPTER, dynamo.SGLANG, sglang.ADAPTER,
)
BY_NAME: dict[str, Adapter] = {a.name: a for a in ADAPTERS}
PRODUCERS: tuple[str, ...] = tuple(BY_NAME)
WANTED: frozenset[str] = frozenset(name for a in ADAPTERS for name in a.families)
# vLLM's own names first: each other prefix costs the parser one more pass over the
# payload (~0.5 ms per 0.36 MB), so the others are looked for only when vLLM's are absent.
VLLM_WANTED: frozenset[str] = frozenset(n for n in WANTED if n.startswith("vllm:"))


def _detects(adapter: Adapter, exp: Exposition) -> bool:
    detect = getattr(adapter, "detect", None)
    return detect(exp) if detect else present(exp, adapter.spec_families)


def detect(exp: Exposition) -> str | None:
    """The first producer whose spec-decode families are present, or None."""
    return next((a.name for a in ADAPTERS if _detects(a, exp)), None)


class NoSpecDecodeFamilies(ParseError):
    """Spec decode is off (its families are absent), which is not zero. ``generation``
    still carries the generation-token counters, so "generating without drafting"
    stays visible."""

    def __init__(self, generation: dict[SeriesKey, float] | None = None,
                 adapters: tuple[Adapter, ...] = ADAPTERS, detected: str | None = None) -> None:
        # vLLM V1's families in full, one per other producer (the line stays readable).
        names = [n for a in adapters for n in (a.spec_families if a is vllm_v1.ADAPTER else a.spec_families[:1])]
        looked_for = ", ".join(dict.fromkeys(names))
        hint = f"; the families present are producer {detected!r}'s" if detected else ""
        super().__init__(f"no speculative-decoding families found (looked for {looked_for}){hint}; "
                         "is spec decode enabled?")
        self.generation = generation or {}


def extract(data: bytes | str, max_bytes: int = config.DEFAULT_MAX_PAYLOAD_BYTES,
            producer: str | None = None) -> Snapshot:
    """Parse a /metrics payload and read it with the named producer's adapter, or
    the detected one. Raises UnsupportedProducer for a producer that is refused."""
    if producer is not None and producer not in BY_NAME:
        raise ValueError(f"unknown producer {producer!r} (known: {', '.join(PRODUCERS)})")
    if producer:
        candidates: tuple[Adapter, ...] = (BY_NAME[producer],)
        exp = parse(data, candidates[0].families, max_bytes)
    else:
        exp = parse(data, VLLM_WANTED, max_bytes)
        if not any(_detects(a, exp) for a in ADAPTERS):
            exp = parse(data, WANTED, max_bytes)
        candidates = tuple(a for a in ADAPTERS if _detects(a, exp))
    for adapter in candidates:
        snap = adapter.snapshot(exp)
        if snap is not None:
            return snap
    generation = next((g for a in (candidates or ADAPTERS) if (g := a.generation_tokens(exp))), {})
    # Named the payload's producer, or another one: say which the families belong to.
    seen = detect(parse(data, WANTED, max_bytes) if producer else exp)
    raise NoSpecDecodeFamilies(generation, candidates if producer else ADAPTERS, seen)
