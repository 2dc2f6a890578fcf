"""NVIDIA Dynamo (1.6): engine metrics passed through on the worker's system port,
with ``dynamo_namespace``, ``dynamo_component``, ``dynamo_endpoint``, ``worker_id``,
``model`` and ``model_name`` added (never overwriting the engine's own labels;
``dynamo/common/utils/prometheus.py``). Dynamo has no spec-decode metrics of its own.

So each engine's own adapter reads them, with ``worker_id`` made part of the engine
(``<worker_id>/<engine>``): workers are never merged. Told apart from the bare
engine by Dynamo's labels on the spec-decode samples.
"""

from __future__ import annotations

from .common import DYNAMO_IDENTITY, DYNAMO_LABELS
from .renamed import VLLM_V1_NAMES, RenamedVllmAdapter
from .sglang import SglangAdapter
from .trtllm import TrtllmAdapter

VLLM = RenamedVllmAdapter("dynamo-vllm", ({n: n for n in VLLM_V1_NAMES},), identity=DYNAMO_IDENTITY, require_labels=DYNAMO_LABELS)
TRTLLM = TrtllmAdapter("dynamo-trtllm", identity=DYNAMO_IDENTITY, require_labels=DYNAMO_LABELS)
SGLANG = SglangAdapter("dynamo-sglang", identity=DYNAMO_IDENTITY, require_labels=DYNAMO_LABELS)
