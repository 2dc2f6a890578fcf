"""Fork each `vllm serve` of the e2e checks from one process that has imported vLLM once.

Usage (with the e2e venv's python, in the servers' environment): forkserver.py
Reads one JSON request a line on stdin and answers one JSON line on stdout:
  {"argv": [...], "log": PATH, "cwd": PATH} -> {"pid": N}   a server forked, in a session of its own
  {"poll": N} -> {"returncode": CODE or null}               null while it runs; -SIGNAL if killed
It exits when stdin closes. Started by driver.VllmServer (driver.forkserver).

Why: a server's boot took about 20 s of CPU, of which about 13 s importing torch,
transformers and vLLM (PRELOAD, measured on this machine kind). Forked from
here, the checks pay the imports once per run instead of once per server. This process
imports and nothing else: no thread, no torch thread pool, no engine before a fork, so a
child starts as a fresh `vllm serve` would, its imports done. vLLM already forks its engine
core from the API server the same way (setup_env.sh, fix 4).

It also fills vLLM's model-info cache (VLLM_CACHE_ROOT/modelinfos) before its first server:
otherwise each server inspects each model class in a subprocess (one more torch + vLLM
import) until the cache holds it, and the first three, booting together, each did. pip
installs with --no-compile; this process's imports write the byte code the servers read.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import time

sys.dont_write_bytecode = False  # write the byte code the servers read, even under PYTHONDONTWRITEBYTECODE

# What `vllm serve` (the API server, the engine core, the CPU worker and its drafters) imports for
# the checks' configurations, but the ngram proposer: numba's llvmlite, imported before the engine
# starts, holds objects that vLLM's scan of sys.modules for its CPU kernel overrides trips on
# (AttributeError: '_lib_fn_wrapper' object has no attribute 'get'); an ngram server imports it
# after that scan, as it does unforked. This is ~11 of a boot's ~13 s of imports.
PRELOAD = (
    "vllm.entrypoints.cli.main", "vllm.entrypoints.cli.serve", "vllm.entrypoints.openai.api_server",
    "vllm.v1.engine.async_llm", "vllm.v1.engine.core", "vllm.v1.executor.multiproc_executor",
    "vllm.v1.worker.cpu_worker", "vllm.v1.worker.cpu_model_runner",
    "vllm.v1.spec_decode.eagle", "vllm.v1.spec_decode.draft_model",
    "vllm.v1.attention.backends.cpu_attn", "vllm.v1.attention.backends.mla.cpu_mla",
)
# The architectures the checks serve: the tiny Llama (target and draft), its EAGLE head, the
# tiny DeepSeek-V3 and its MTP layer.
ARCHS = ("LlamaForCausalLM", "EagleLlamaForCausalLM", "DeepseekV3ForCausalLM", "DeepSeekMTPModel")


def prime_model_info() -> None:
    """Inspect the checks' model classes in a forked child, which writes vLLM's model-info cache
    (a hit when a fork server of the same cache did it before). vLLM inspects in a subprocess
    only to keep CUDA out of the API server; on CPU the result is the same in the child. A child,
    so that whatever the inspection starts (threads, torch's pool) never reaches a server's fork."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            from vllm.model_executor.models import registry

            registry._run_in_subprocess = lambda fn: fn()
            for arch in ARCHS:
                registry.ModelRegistry.models[arch].inspect_model_cls()
        except BaseException as e:  # the servers inspect what is missing themselves, only slower
            print(f"forkserver: model-info priming: {type(e).__name__}: {e}", flush=True)
            code = 1
        os._exit(code)
    os.waitpid(pid, 0)


def serve(requests, replies) -> dict:
    """Answer requests until stdin closes; returns only in a forked child, with its request."""
    codes: dict[int, int] = {}
    while line := requests.readline():
        req = json.loads(line)
        if "argv" in req:
            pid = os.fork()
            if pid == 0:
                return req
            # pid_max is 32768 here: a pid can come back within a run, and an earlier server's
            # code under it would read this one, alive, as ended.
            codes.pop(pid, None)
            reply = {"pid": pid}
        else:
            while True:  # reap every server that ended (a zombie would keep its session alive)
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                codes[pid] = os.waitstatus_to_exitcode(status)
            reply = {"returncode": codes.get(req["poll"])}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
    raise SystemExit(0)


def main() -> None:
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever an import prints goes to stderr, never into the replies
    import vllm  # noqa: F401  (a broken install fails here: the driver shows this log's tail)

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError as e:  # a module this vLLM lacks: a child imports what it needs
            print(f"forkserver: import {name}: {e}", flush=True)
    assert threading.active_count() == 1, f"an import started a thread: {threading.enumerate()}"
    started = time.monotonic()
    prime_model_info()
    print(f"forkserver: model-info cache primed in {time.monotonic() - started:.1f} s", flush=True)
    print(f"forkserver: vLLM imported, pid {os.getpid()}", flush=True)
    replies.write(json.dumps({"ready": os.getpid()}) + "\n")
    replies.flush()
    req = serve(sys.stdin, replies)
    # The child: a `vllm serve` in its own session (stopped with os.killpg, as a Popen with
    # start_new_session), its output in its log, exiting through the interpreter (atexit runs).
    os.setsid()
    replies.close()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    os.chdir(req["cwd"])
    sys.argv = req["argv"]
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.exit(vllm_main())


if __name__ == "__main__":
    main()
