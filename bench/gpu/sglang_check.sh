#!/usr/bin/env bash
# Check areal's SGLang backend against real SGLang on a GPU machine (not run in CI).
# Needs: an NVIDIA GPU, and areal installed with SGLang (pip install 'areal[sglang]').
# Usage: bench/gpu/sglang_check.sh [--model DIR] [--workdir DIR] [--extra-arg=--disable-cuda-graph]
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python}"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "FAIL no NVIDIA GPU visible (nvidia-smi -L failed)" >&2
    exit 1
fi
if ! "$PYTHON" -c "import sglang, areal" >/dev/null 2>&1; then
    echo "FAIL $PYTHON cannot import sglang and areal: pip install 'areal[sglang]' on a GPU machine" >&2
    exit 1
fi
nvidia-smi -L
"$PYTHON" -c "import sglang, torch; print(f'sglang {sglang.__version__}, torch {torch.__version__}')"
exec "$PYTHON" bench/gpu/sglang_check.py "$@"
