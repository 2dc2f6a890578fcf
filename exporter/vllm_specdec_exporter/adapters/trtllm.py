"""TensorRT-LLM (trtllm-serve /prometheus/metrics, NVIDIA/TensorRT-LLM #12545, #12636).

Two sets of counters with different time bases:

- per iteration, in-flight requests included: ``trtllm_spec_decode_num_draft_tokens_total``
  and ``..._num_accepted_tokens_total`` (no drafts counter);
- per finished request (needs ``return_perf_metrics: true``): drafted and accepted
  tokens per draft position, labelled ``token_position``.

Every figure is taken from the per-position counters, so that all of them share one
base (finished requests): drafts = drafted at position 0 (every verify step drafts
position 0), draft tokens = the sum of drafted, accepted = the sum of accepted,
per position = accepted at that position. Mixing in the iteration counters would
divide in-flight tokens by finished drafts. TRT-LLM creates a position's series on
its first non-zero increment (``tensorrt_llm/metrics/collector.py``
``log_request_metrics_dict``), so an accepted series missing beside a drafted one is
0. Without the per-position counters there is no drafts count: the engine is left
out with a warning. The ``acceptance_length`` gauge (last iteration only) is not read.
"""

from __future__ import annotations

from collections.abc import Iterable

from .. import config
from ..model import Counters, SeriesKey, Snapshot, series_name
from ..parser import Exposition, Sample
from .common import LabelledAdapter, bounded, positions, short

DRAFTED = "trtllm_spec_decode_drafted_tokens_total"
ACCEPTED = "trtllm_spec_decode_accepted_tokens_total"
ITER_DRAFT_TOKENS = "trtllm_spec_decode_num_draft_tokens_total"
ITER_ACCEPTED = "trtllm_spec_decode_num_accepted_tokens_total"
GENERATION = "trtllm_generation_tokens_total"  # per finished request, like the per-position counters
LABEL_POSITION = "token_position"


class TrtllmAdapter(LabelledAdapter):
    default_name = "trtllm"
    spec_families = (DRAFTED, ACCEPTED, ITER_DRAFT_TOKENS, ITER_ACCEPTED)
    families = (*spec_families, GENERATION)
    approximate: tuple[str, ...] = ()

    def _per_key(
        self, samples: Iterable[Sample], warnings: list[str], impossible: list[str] | None = None
    ) -> dict[SeriesKey, float]:
        out: dict[SeriesKey, float] = {}
        for s in samples:
            key = self._key(s)
            if not bounded(s, key, warnings, impossible):
                continue
            if key in out:
                warnings.append(f"{short(s)} repeats ({series_name(key)}); first value kept")
                continue
            out[key] = s.value
        return out

    def generation_tokens(self, exp: Exposition) -> dict[SeriesKey, float]:
        return self._per_key(exp.samples.get(GENERATION, ()), [])

    def snapshot(self, exp: Exposition) -> Snapshot | None:
        if not self.detect(exp):
            return None
        warnings: list[str] = []
        impossible: list[str] = []  # values no counter can hold: invariant violations
        drafted, drafted_beyond = positions(exp.samples.get(DRAFTED, ()), LABEL_POSITION, self._key, warnings, impossible)
        accepted, accepted_beyond = positions(exp.samples.get(ACCEPTED, ()), LABEL_POSITION, self._key, warnings, impossible)
        generation = self._per_key(exp.samples.get(GENERATION, ()), warnings, impossible)
        iteration = {
            key
            for n in (ITER_DRAFT_TOKENS, ITER_ACCEPTED)
            for s in exp.samples.get(n, ())
            if bounded(s, key := self._key(s), warnings, impossible)
        }
        beyond = drafted_beyond | accepted_beyond
        engines: dict[SeriesKey, Counters] = {}
        for key in sorted(iteration | set(drafted) | set(accepted)):
            if key in beyond:  # its totals are the positions' sums: they would miss some
                warnings.append(f"{series_name(key)}: a position beyond the largest k={config.MAX_K}; engine left out")
                continue
            d, a = drafted.get(key, {}), accepted.get(key, {})
            if not d:
                warnings.append(
                    f"{series_name(key)}: no {DRAFTED} (return_perf_metrics off, or no request "
                    "finished yet): no drafts count, engine left out"
                )
                continue
            k = len(d)
            if sorted(d) != list(range(k)) or not set(a) <= set(d):
                warnings.append(
                    f"{series_name(key)}: drafted positions {sorted(d)} and accepted positions {sorted(a)} "
                    "are not 0..k-1; engine left out"
                )
                continue
            per_position = tuple(a.get(i, 0.0) for i in range(k))
            c = Counters(
                drafts=d[0],
                draft_tokens=sum(d.values()),
                accepted=sum(per_position),
                per_position=per_position,
                generation_tokens=generation.get(key),
            )
            engines[key] = c
        return Snapshot(
            producer=self.name,
            engines=engines,
            warnings=tuple(warnings) + tuple(exp.issue_messages()),
            malformed_lines=exp.malformed_lines,
            duplicate_series=exp.duplicate_series,
            impossible_values=len(impossible),
        )


ADAPTER = TrtllmAdapter()
