"""SGLang (>= 0.5.15): only approximate figures, and no per-position data.

SGLang's /metrics has no counter of drafted or accepted tokens. What it has:

- ``sglang:spec_verify_calls_total``: verify forwards of *finished* requests (0.5.15+);
- ``sglang:generation_tokens_total``: output tokens of finished requests (summed over
  ``is_streaming``);
- the gauge ``sglang:spec_num_draft_tokens``: the active draft width (0.5.15+).

From them, as SGLang itself defines a request's acceptance length
(completion_tokens / verify_ct, ``tokenizer_manager.py``): drafts = verify calls,
accepted = generation - verify calls (so AL = generation / verify calls), draft
tokens = verify calls x (num_draft_tokens - 1), SGLang's own ``draft_per_round``.
All approximate: the first token comes from prefill (AL biased upward), requests
count only when they finish, requests with no verify step add tokens only, and the
draft-token figure assumes a constant width (wrong under adaptive or tree
verification). The interval gauges ``spec_accept_length`` / ``spec_accept_rate``
cannot be summed or windowed and are not read. Older SGLang (no verify counter) is
refused.
"""

from __future__ import annotations

from ..model import Counters, SeriesKey, Snapshot, series_name
from ..parser import Exposition
from .common import LabelledAdapter, UnsupportedProducer, bounded

VERIFY_CALLS = "sglang:spec_verify_calls_total"
GENERATION = "sglang:generation_tokens_total"
NUM_DRAFT_TOKENS = "sglang:spec_num_draft_tokens"
ACCEPT_LENGTH = "sglang:spec_accept_length"  # interval gauge: only tells SGLang apart


class SglangAdapter(LabelledAdapter):
    # One tokenizer counts a server's finished requests: priority, is_streaming and
    # custom labels split the same requests, so samples of one key are summed.
    default_name = "sglang"
    spec_families = (VERIFY_CALLS, ACCEPT_LENGTH)
    families = (VERIFY_CALLS, ACCEPT_LENGTH, NUM_DRAFT_TOKENS, GENERATION)
    approximate = ("mean_acceptance_length", "acceptance_rate")

    def _sums(
        self, name: str, exp: Exposition, warnings: list[str], impossible: list[str] | None = None
    ) -> dict[SeriesKey, float]:
        out: dict[SeriesKey, float] = {}
        for s in exp.samples.get(name, ()):
            key = self._key(s)
            if bounded(s, key, warnings, impossible):
                out[key] = out.get(key, 0.0) + s.value
        return out

    def generation_tokens(self, exp: Exposition) -> dict[SeriesKey, float]:
        return self._sums(GENERATION, exp, [])

    def snapshot(self, exp: Exposition) -> Snapshot | None:
        if not self.detect(exp):
            return None
        if not exp.samples.get(VERIFY_CALLS):
            raise UnsupportedProducer(
                self.name,
                f"SGLang without {VERIFY_CALLS} (before 0.5.15): only interval "
                "gauges, from which no window can be derived; run SGLang >= 0.5.15",
            )
        warnings: list[str] = []
        impossible: list[str] = []  # values no counter can hold: invariant violations
        verify = self._sums(VERIFY_CALLS, exp, warnings, impossible)
        generation = self._sums(GENERATION, exp, warnings, impossible)
        widths: dict[SeriesKey, set[float]] = {}
        for s in exp.samples.get(NUM_DRAFT_TOKENS, ()):  # one per scheduler rank: they must agree
            widths.setdefault(self._key(s), set()).add(s.value)
        engines: dict[SeriesKey, Counters] = {}
        for key in sorted(verify):
            width = widths.get(key, set())
            gen = generation.get(key)
            if verify[key] == 0 and not any(w > 1 for w in width):
                continue  # spec decode off (SGLang keeps its spec families at 0)
            if len(width) != 1 or not next(iter(width)) > 1 or not next(iter(width)) < 1e6:
                warnings.append(
                    f"{series_name(key)}: {NUM_DRAFT_TOKENS} is {sorted(width) or 'absent'}, not one width "
                    "above 1; engine left out"
                )
                continue
            if gen is None or gen < verify[key]:
                warnings.append(f"{series_name(key)}: {GENERATION}={gen} below {VERIFY_CALLS}={verify[key]:g}; engine left out")
                continue
            c = Counters(
                drafts=verify[key],
                draft_tokens=verify[key] * (next(iter(width)) - 1),
                accepted=gen - verify[key],
                per_position=(),
                generation_tokens=gen,
            )
            engines[key] = c
        if not engines and not warnings:
            return None  # nothing but zeros: spec decode off, as for vLLM's absent families
        return Snapshot(
            producer=self.name,
            engines=engines,
            warnings=tuple(warnings) + tuple(exp.issue_messages()),
            malformed_lines=exp.malformed_lines,
            duplicate_series=exp.duplicate_series,
            approximate=self.approximate,
            impossible_values=len(impossible),
        )


ADAPTER = SglangAdapter()
