"""Producers that expose vLLM V1's counters under another prefix and/or with extra
identity labels (LMDeploy, Ray Serve, Dynamo's vLLM, llama.cpp): their families are
renamed onto vLLM V1's so that the V1 adapter reads them unchanged."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from .. import config
from ..model import SeriesKey, Snapshot
from ..parser import Exposition, Sample
from . import vllm_v1  # the adapter the renamed families feed
from .common import engine_id, families_present


def relabel(exp: Exposition, renames: Mapping[str, str], identity: Iterable[str] = ()) -> Exposition:
    """A copy of ``exp`` with ``renames`` (source name -> vLLM V1 name) applied and the
    engine label rebuilt from ``identity`` (so replicas/workers stay distinct)."""
    identity = tuple(identity)
    out = Exposition(
        malformed_lines=exp.malformed_lines,
        duplicate_series=exp.duplicate_series,
        issues=list(exp.issues),
        openmetrics=exp.openmetrics,
        size=exp.size,
    )
    for src, dst in renames.items():
        samples = exp.samples.get(src)
        if samples:
            out.samples[dst] = [
                Sample(dst, {**s.labels, config.LABEL_ENGINE: engine_id(s.labels, identity)}, s.value) for s in samples
            ]
    return out


def rename_back(messages: Iterable[str], renames: Mapping[str, str]) -> tuple[str, ...]:
    """Warnings name the producer's own families, not the vLLM names they were mapped to."""
    out = []
    for m in messages:
        for src, dst in renames.items():
            m = m.replace(dst, src)
        out.append(m)
    return tuple(out)


# vLLM V1's five families; other producers that copy the scheme differ by prefix.
VLLM_V1_NAMES = (
    config.VLLM_V1_DRAFTS,
    config.VLLM_V1_DRAFT_TOKENS,
    config.VLLM_V1_ACCEPTED,
    config.VLLM_V1_ACCEPTED_PER_POS,
    config.VLLM_V1_GENERATION_TOKENS,
)


def with_prefix(prefix: str, generation: bool = True) -> dict[str, str]:
    """{'<prefix>spec_decode_...': 'vllm:spec_decode_...'} for vLLM's names."""
    names = VLLM_V1_NAMES if generation else VLLM_V1_NAMES[:4]
    return {prefix + n.removeprefix("vllm:"): n for n in names}


class RenamedVllmAdapter:
    """A producer exposing vLLM V1's four counters under another prefix and/or with
    extra identity labels: renamed onto vLLM's names and read by the V1 adapter, so
    both share one implementation (figures, checks, warnings)."""

    def __init__(
        self, name: str, renames: tuple[dict[str, str], ...], identity: tuple[str, ...] = (), require_labels: tuple[str, ...] = ()
    ):
        self._v1 = vllm_v1.ADAPTER
        self.name = name
        self._renames = renames  # alternatives (e.g. a newer and an older prefix), first present wins
        self._identity = identity
        self._require_labels = require_labels  # e.g. Dynamo's labels: without them, plain vLLM
        self.spec_families = tuple(src for r in renames for src, dst in r.items() if dst != config.VLLM_V1_GENERATION_TOKENS)
        self.families = tuple(src for r in renames for src in r)
        self.approximate: tuple[str, ...] = ()

    def _score(self, exp: Exposition, renames: dict[str, str]) -> int:
        spec = [s for s, d in renames.items() if d != config.VLLM_V1_GENERATION_TOKENS]
        return families_present(exp, spec, self._require_labels)

    def _active(self, exp: Exposition) -> dict[str, str] | None:
        return next((r for r in self._renames if self._score(exp, r)), None)

    def score(self, exp: Exposition) -> int:
        return max(self._score(exp, r) for r in self._renames)

    def detect(self, exp: Exposition) -> bool:
        return self._active(exp) is not None

    def generation_tokens(self, exp: Exposition) -> dict[SeriesKey, float]:
        for r in self._renames:
            found = self._v1.generation_tokens(relabel(exp, r, self._identity))
            if found:
                return found
        return {}

    def snapshot(self, exp: Exposition) -> Snapshot | None:

        renames = self._active(exp)
        if renames is None:
            return None
        snap = self._v1.snapshot(relabel(exp, renames, self._identity))
        if snap is None:
            return None
        return replace(snap, producer=self.name, warnings=rename_back(snap.warnings, renames))
