#!/usr/bin/env bash
# SGLang and vLLM on one GPU, as areal drives them (not run in CI; sized for < 8 minutes on one
# H100/H200-class GPU). One line per check:
#   launch, generate with log-probs, streams, pause modes, weights from disk, per-token versions
#   across an update (engines_check.py, per backend); NCCL weight update from a trainer rank on
#   GPU 0 to each engine on GPU 1 (check_nccl_sync.py; SKIP with one GPU: NCCL refuses two ranks
#   of a group on one device);
#   a 3-step `areal train` per backend on a random-init 0.5B-class Qwen3.
# Needs: an NVIDIA GPU; areal with SGLang in $PYTHON (pip install 'areal[sglang]'); vLLM in
# $VLLM_PYTHON (default: $PYTHON).
# Usage: bench/gpu/check_engines.sh [WORKDIR]
set -uo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python}"
VLLM_PYTHON="${VLLM_PYTHON:-$PYTHON}"
WORK="${1:-$(mktemp -d -t areal-engines-XXXX)}"
mkdir -p "$WORK"
failed=0

if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "FAIL gpu: no NVIDIA GPU visible (nvidia-smi -L failed)"
    exit 1
fi
echo "INFO $(nvidia-smi -L | head -1); work dir $WORK"

step() {  # step NAME SECONDS CMD...: one line, PASS or FAIL, the log kept in $WORK/NAME.log
    local name="$1" limit="$2"
    shift 2
    local start=$SECONDS rc
    timeout "$limit" "$@" >"$WORK/$name.log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then
        echo "PASS $name ($((SECONDS - start))s)"
    elif [ "$rc" -eq 2 ] && grep -q '^SKIP' "$WORK/$name.log"; then  # the check says why not
        grep -m1 '^SKIP' "$WORK/$name.log"
    else
        echo "FAIL $name ($((SECONDS - start))s): see $WORK/$name.log"
        grep -E '^(PASS|FAIL)' "$WORK/$name.log" | sed 's/^/    /' | tail -20
        failed=1
    fi
}

# A random-init 0.5B-class Qwen3 (Qwen2.5-0.5B's shape, areal's 4096-token tokenizer).
step make-model 120 "$PYTHON" - "$WORK/model" <<'PY'
import json, sys
from pathlib import Path
import torch
from areal.plugins.models.config import DecoderConfig, RopeConfig
from areal.plugins.models.hf_io import save_model
from areal.plugins.models.qwen3 import Qwen3ForCausalLM
from areal.plugins.models.tokenizer import build_tokenizer, special_token_ids
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
ids = special_token_ids()
config = DecoderConfig(
    model_type="qwen3", vocab_size=4096, hidden_size=896, intermediate_size=4864,
    num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, head_dim=64,
    max_position_embeddings=4096, tie_word_embeddings=True, rope=RopeConfig(theta=1_000_000.0),
    qk_norm=True, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
    torch_dtype="bfloat16",
)
model = Qwen3ForCausalLM(config)
model.init_weights(generator=torch.Generator().manual_seed(0))
save_model(model, out)
build_tokenizer(out, vocab_size=4096)
(out / "generation_config.json").write_text(json.dumps({"eos_token_id": config.eos_token_id}))
print(f"PASS {model.num_parameters() / 1e6:.0f}M parameters at {out}")
PY

step sglang-engine 240 "$PYTHON" bench/gpu/engines_check.py --backend sglang --model "$WORK/model" --workdir "$WORK/sglang"
step sglang-nccl-update 180 "$PYTHON" bench/gpu/check_nccl_sync.py --backend sglang --workdir "$WORK/nccl-sglang"
step vllm-engine 240 "$PYTHON" bench/gpu/engines_check.py --backend vllm --python "$VLLM_PYTHON" --model "$WORK/model" --workdir "$WORK/vllm"
step vllm-nccl-update 240 "$PYTHON" bench/gpu/check_nccl_sync.py --backend vllm --python "$VLLM_PYTHON" --workdir "$WORK/nccl-vllm"

for backend in sglang vllm; do
    step "train-3-steps-$backend" 300 "$PYTHON" -m areal train configs/quickstart.yaml \
        -o "$WORK/train-$backend" \
        --set model.path="$WORK/model" --set model.init_tiny=null --set model.dtype=bfloat16 \
        --set warm_start.steps=0 --set train.max_steps=3 --set train.device=cuda \
        --set train.global_batch_size=32 --set train.mini_batch_size=32 \
        --set async.trigger_batch_size=32 --set agent.concurrency=32 \
        --set inference.backend="$backend" --set inference.mem_fraction_static=0.3 \
        --set inference.vllm_python="$VLLM_PYTHON" \
        --set logging.log_dir="$WORK/train-$backend/logs"
    grep -E '^\[train\] step=' "$WORK/train-$backend/logs/train.log" 2>/dev/null | cut -c1-160 | sed 's/^/    /'
done

exit $failed
