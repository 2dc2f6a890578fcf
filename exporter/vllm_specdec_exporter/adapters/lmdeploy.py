"""LMDeploy >= 0.18 (InternLM/lmdeploy #4625): vLLM's four counters under the
``lmdeploy:`` prefix, labels ``model_name`` and ``engine`` (= dp_rank); per-position
series are created lazily.

Its gauges (``lmdeploy:spec_decode_mean_accept_rate``, ``..._mean_accept_length``,
``..._per_position_accept_rate``) are lifetime averages computed from the same
counters: they are never read (a window needs counter deltas).
"""

from __future__ import annotations

from .renamed import RenamedVllmAdapter, with_prefix

PREFIX = "lmdeploy:"

ADAPTER = RenamedVllmAdapter("lmdeploy", (with_prefix(PREFIX, generation=False),))
