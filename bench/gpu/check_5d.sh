#!/usr/bin/env bash
# The 5D trainer's GPU-only paths on one GPU machine, in one script sized for < 8 minutes:
#   1. bf16 mixed precision + torch.compile + FSDP2 over NCCL tracks the fp32 eager step,
#   2. `areal train` for 3 steps with the trainer on the GPU (the embedded engine on the CPU),
#   3. the CPU parity suite on this machine's torch (gloo; the same checks CI runs),
#   4. a collective weight sync over NCCL from the trainer to a real SGLang server (when SGLang is
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

train_on_cuda() {  # a 3-step run: the trainer on the GPU, the embedded engine on the CPU
    local out
    out="$(mktemp -d -t areal-cuda-XXXX)"
    "$PYTHON" -m areal train configs/quickstart.yaml -o "$out" --set train.device=cuda \
        --set model.path="$out/model" --set logging.log_dir="$out/logs" \
        --set warm_start.steps=50 --set train.max_steps=3 >"$out/stdout.txt" 2>&1 || {
        tail -20 "$out/stdout.txt"
        return 1
    }
    grep -E '^\[train\] step=' "$out/logs/train.log" | cut -c1-160
    grep -q '^\[train\] step=3 ' "$out/logs/train.log"
}

step "bf16 + compile + FSDP2 over NCCL" 180 "$PYTHON" -m pytest -q -x -p no:cacheprovider tests/plugins/trainer/parallel/test_gpu.py -m gpu
export -f train_on_cuda
export PYTHON
step "areal train, 3 steps, trainer on CUDA" 240 bash -c train_on_cuda
step "parity suite (gloo, CPU)" 240 "$PYTHON" -m pytest -q -p no:cacheprovider -n 4 --dist loadfile tests/plugins/trainer/parallel -m "not gpu"
if "$PYTHON" -c "import sglang" >/dev/null 2>&1; then
    step "collective weight sync over NCCL to SGLang" 240 "$PYTHON" bench/gpu/check_nccl_sync.py
else
    echo "SKIP collective weight sync over NCCL: sglang is not installed (pip install 'areal[sglang]')"
fi
exit $failed
