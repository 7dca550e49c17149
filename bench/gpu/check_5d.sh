#!/usr/bin/env bash
# The 5D trainer's GPU-only paths on one GPU machine, in one script sized for < 8 minutes:
#   1. the CPU parity suite on this machine's torch (gloo; the same checks CI runs),
#   2. bf16 mixed precision + torch.compile + FSDP2 over NCCL tracks the fp32 eager step,
#   3. a collective weight sync over NCCL from the trainer to a real SGLang server (when SGLang is
#      installed: pip install 'areal[sglang]'), the engine then serving the broadcast weights.
# Usage: bench/gpu/check_5d.sh            (PYTHON=... to pick the interpreter)
# Prints PASS/FAIL per step and exits 1 if any failed. Not run in CI.
set -uo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python}"
failed=0
step() {  # step NAME SECONDS COMMAND...
    local name="$1" limit="$2"; shift 2
    local started=$SECONDS
    if timeout "$limit" "$@"; then
        echo "PASS $name ($((SECONDS - started)) s)"
    else
        echo "FAIL $name (exit $?, $((SECONDS - started)) s)"
        failed=1
    fi
}

if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "FAIL no NVIDIA GPU visible (nvidia-smi -L failed)" >&2
    exit 1
fi
nvidia-smi -L
"$PYTHON" -c "import torch; print(f'torch {torch.__version__}, cuda {torch.version.cuda}, nccl {torch.cuda.nccl.version()}')"

step "parity suite (gloo, CPU)" 180 "$PYTHON" -m pytest -q -x -p no:cacheprovider tests/plugins/trainer/parallel -m "not gpu"
step "bf16 + compile + FSDP2 over NCCL" 180 "$PYTHON" -m pytest -q -x -p no:cacheprovider tests/plugins/trainer/parallel/test_gpu.py -m gpu
if "$PYTHON" -c "import sglang" >/dev/null 2>&1; then
    step "collective weight sync over NCCL to SGLang" 240 "$PYTHON" bench/gpu/check_nccl_sync.py
else
    echo "SKIP collective weight sync over NCCL: sglang is not installed (pip install 'areal[sglang]')"
fi
exit $failed
