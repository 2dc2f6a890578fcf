"""Ray Serve LLM: vLLM's metrics through ``ray.util.metrics``, named ``ray_vllm_...``
(vLLM >= 0.11, #25439) or ``ray_vllm:...`` (older), with Ray's tags added.

Each replica is its own engine, never merged with another: the engine becomes
``<ReplicaId>/<engine>`` (``<WorkerId>/<engine>`` before vLLM added ReplicaId).
"""

from __future__ import annotations

from .common import RAY_IDENTITY
from .renamed import RenamedVllmAdapter, with_prefix

PREFIXES = ("ray_vllm_", "ray_vllm:")

ADAPTER = RenamedVllmAdapter("ray-serve", tuple(with_prefix(p) for p in PREFIXES), identity=RAY_IDENTITY)
