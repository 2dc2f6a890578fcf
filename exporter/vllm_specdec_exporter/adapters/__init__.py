"""Producer adapters: parsed families -> typed Snapshot.

Each producer (vLLM V1 today; vLLM V0, SGLang, TensorRT-LLM, llama.cpp later) is
one module exposing an ``ADAPTER`` with the sample names it needs and a
``snapshot()`` that returns None when its spec-decode families are absent. Adding
a producer is that module plus one entry in ``ADAPTERS``.
"""

from __future__ import annotations

from typing import Protocol

from .. import config
from ..model import SeriesKey, Snapshot
from ..parser import Exposition, ParseError, parse
from . import vllm_v1


class Adapter(Protocol):
    name: str
    families: tuple[str, ...]  # every sample name it reads
    spec_families: tuple[str, ...]  # the ones whose presence means "spec decode on"

    def snapshot(self, exp: Exposition) -> Snapshot | None: ...

    def generation_tokens(self, exp: Exposition) -> dict[SeriesKey, float]: ...


ADAPTERS: tuple[Adapter, ...] = (vllm_v1.ADAPTER,)
WANTED: frozenset[str] = frozenset(name for a in ADAPTERS for name in a.families)


class NoSpecDecodeFamilies(ParseError):
    """Spec decode is off (its families are absent), which is not zero. ``generation``
    still carries the generation-token counters, so "generating without drafting"
    stays visible."""

    def __init__(self, generation: dict[SeriesKey, float] | None = None) -> None:
        looked_for = ", ".join(n for a in ADAPTERS for n in a.spec_families)
        super().__init__(f"no speculative-decoding families found (looked for {looked_for}); is spec decode enabled?")
        self.generation = generation or {}


def extract(data: bytes | str, max_bytes: int = config.DEFAULT_MAX_PAYLOAD_BYTES) -> Snapshot:
    """Parse a /metrics payload and return the first producer's snapshot that matches."""
    exp = parse(data, WANTED, max_bytes)
    for adapter in ADAPTERS:
        snap = adapter.snapshot(exp)
        if snap is not None:
            return snap
    raise NoSpecDecodeFamilies(next((g for a in ADAPTERS if (g := a.generation_tokens(exp))), {}))
