"""llama.cpp server (tools/server, after ggml-org/llama.cpp #26389): vLLM's four
counters under the ``llamacpp:`` prefix, no labels (one engine, no model name).

The per-position family is absent until the first speculative request finishes
(counters move at slot release): the engine is then read with k=0, not dropped.
Its generation counter (``llamacpp:tokens_predicted_total``) is not read: whether
it moves with the same slot release was not verified.
"""

from __future__ import annotations

from dataclasses import replace

from ..model import Snapshot
from ..parser import Exposition
from .renamed import RenamedVllmAdapter, with_prefix

PREFIX = "llamacpp:"


class LlamacppAdapter(RenamedVllmAdapter):
    def snapshot(self, exp: Exposition) -> Snapshot | None:

        snap = super().snapshot(exp)
        if snap is None:
            return None
        # Drafts counted but no per-position series: the first speculative request
        # finished, so the series exist and this scrape was cut off before them.
        cut = [key for key, c in snap.engines.items() if not c.k and c.drafts > 0]
        if not cut:
            return snap
        warnings = [
            f"{PREFIX}spec_decode_num_accepted_tokens_per_pos_total absent while drafts were counted "
            "(a cut-off scrape?); engine left out"
        ]
        return replace(
            snap, engines={k: c for k, c in snap.engines.items() if k not in cut}, warnings=snap.warnings + tuple(warnings)
        )


ADAPTER = LlamacppAdapter("llamacpp", (with_prefix(PREFIX, generation=False),))
