"""llama.cpp server (tools/server, after ggml-org/llama.cpp #26389): vLLM's four
counters under the ``llamacpp:`` prefix, no labels (one engine, no model name).

The per-position family is absent until the first speculative request finishes
(counters move at slot release): the engine is then read with k=0, not dropped.
Its generation counter (``llamacpp:tokens_predicted_total``) is not read: whether
it moves with the same slot release was not verified.
"""

from __future__ import annotations

from .common import RenamedVllmAdapter, with_prefix

PREFIX = "llamacpp:"

ADAPTER = RenamedVllmAdapter("llamacpp", (with_prefix(PREFIX, generation=False),))
