"""vLLM V0 (legacy ``vllm/engine/metrics.py``, removed in 0.11): recognised and refused.

V0 added its cumulative-since-start aggregates to its counters every interval, so
``..._num_accepted_tokens_total`` and ``..._num_draft_tokens_total`` hold sums of
sums (the fix, vllm #15415, was closed unmerged), and V0 exposes no drafts or
per-position counter. Its names collide with V1's, so it is told apart by the
families only V0 had.
"""

from __future__ import annotations

from ..model import SeriesKey, Snapshot
from ..parser import Exposition
from .common import UnsupportedProducer, present

ACCEPTANCE_RATE = "vllm:spec_decode_draft_acceptance_rate"
EFFICIENCY = "vllm:spec_decode_efficiency"
EMITTED = "vllm:spec_decode_num_emitted_tokens_total"


class VllmV0Adapter:
    name = "vllm-v0"
    spec_families = (ACCEPTANCE_RATE, EFFICIENCY, EMITTED)
    families = spec_families
    approximate: tuple[str, ...] = ()

    def detect(self, exp: Exposition) -> bool:
        return present(exp, self.spec_families)

    def generation_tokens(self, exp: Exposition) -> dict[SeriesKey, float]:
        return {}

    def snapshot(self, exp: Exposition) -> Snapshot | None:

        if not self.detect(exp):
            return None
        raise UnsupportedProducer(
            self.name,
            f"vLLM V0 metrics ({', '.join(n for n in self.spec_families if exp.samples.get(n))}): V0's "
            "spec-decode counters are sums of sums and it has no drafts or per-position counter, so no "
            "figure would be right; run vLLM >= 0.11 (the V1 engine)",
        )


ADAPTER = VllmV0Adapter()
