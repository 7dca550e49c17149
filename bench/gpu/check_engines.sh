#!/usr/bin/env bash
# SGLang and vLLM on one GPU, as areal drives them (not run in CI; sized for < 8 minutes on one
# H100/H200-class GPU). One line per check:
#   launch, generate with log-probs, streams, pause modes, weights from disk, per-token versions
#   across an update (engines_check.py, per backend); NCCL weight update from a trainer rank on
#   GPU 0 to each engine on GPU 1 (check_nccl_sync.py; SKIP with one GPU: NCCL refuses two ranks
#   of a group on one device);
#   the behaviour log-prob rule at T = 0.7 with a forced tool call, engine against trainer, per
#   backend; a 3-step `areal train` per backend on a random-init 0.5B-class Qwen3.
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

# The behaviour log-prob rule (docs/inference.md, "Log-probs"): each engine's reported log-probs
# at T = 0.7 and top-p 0.9, on a tool call forced by the gateway's grammar (a structural tag: the
# call's JSON, then its closing tag), against the trainer's
# value, log softmax(z / T) over the whole vocabulary from a teacher-forced transformers forward.
# PASS when the largest gap over all tokens is below 0.02 (bf16 engines against an fp32 forward);
# the grammar-forced tokens are reported apart, as SGLang's are known to come back masked.
for backend in sglang vllm; do
    engine_python="$PYTHON"
    [ "$backend" = vllm ] && engine_python="$VLLM_PYTHON"
    step "logprob-rule-$backend" 300 "$PYTHON" - "$backend" "$engine_python" "$WORK/model" "$WORK/rule-$backend" <<'PY'
import asyncio, json, os, sys
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM
from areal.core.engine_client import engine_client
from areal.core.plugins import registry
from areal.gateway.chat_messages import forced_call_tag
from areal.host.process import ServerProcess, pick_free_port
from areal.run.processes import server_env
backend, python, model_dir, work = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
work.mkdir(parents=True, exist_ok=True)
T, TOP_P = 0.7, 0.9
spec = registry("inference_backends").get(backend)
port = pick_free_port()
options = {"model_path": model_dir, "port": port, "weight_version": "0", "seed": 0, "tp_size": 1,
           "mem_fraction_static": 0.3, "log_level": "warning", "python_executable": python}
server = ServerProcess(spec.load_launcher()(options), log_path=work / "engine.log",
                       env={**os.environ, **server_env(spec.env)})
url = f"http://127.0.0.1:{port}"
server.start()
try:
    server.wait_healthy(url, 240)
    call = {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"]}}, "required": ["name", "arguments"]}
    prompt = list(range(10, 40))
    # The grammar the gateway sends for a forced call: its JSON, then the closing tag.
    sampling = {"max_new_tokens": 48, "temperature": T, "top_p": TOP_P,
                "structural_tag": json.dumps(forced_call_tag(call, "\n</tool_call>"))}
    async def go():
        client = engine_client(backend, url, timeout=120)
        try:
            outs = [await client.generate(input_ids=prompt, sampling_params={**sampling,
                    "sampling_seed": seed}) for seed in range(4)]
            free = await client.generate(input_ids=prompt, sampling_params={
                "max_new_tokens": 48, "temperature": T, "top_p": TOP_P, "sampling_seed": 9})
            return outs, free
        finally:
            await client.aclose()
    outs, free = asyncio.run(go())
finally:
    server.stop()
model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).cuda().eval()
def gaps(out):
    ids = prompt + list(out.output_ids)
    with torch.no_grad():
        logits = model(torch.tensor([ids], device="cuda")).logits[0, len(prompt) - 1 : -1]
    trainer = torch.log_softmax(logits.float() / T, dim=-1)
    trainer = trainer.gather(1, torch.tensor(out.output_ids, device="cuda")[:, None])[:, 0]
    engine = torch.tensor(out.output_logprobs, device="cuda")
    return (engine - trainer).abs(), engine, trainer
worst = 0.0
for name, group in (("forced", outs), ("free", [free])):
    gap = torch.cat([gaps(o)[0] for o in group])
    forced_near_zero = sum(int((gaps(o)[1] > -1e-3).sum()) for o in group)
    print(f"INFO {backend} {name}: {gap.numel()} tokens, max |engine - trainer| "
          f"{gap.max().item():.4f}, mean {gap.mean().item():.5f}, engine log-probs > -1e-3: "
          f"{forced_near_zero}")
    worst = max(worst, gap.max().item())
ok = worst < 0.02
print(f"{'PASS' if ok else 'FAIL'} {backend} log-prob rule at T={T} top_p={TOP_P} with a forced "
      f"tool call: max gap {worst:.4f}")
sys.exit(0 if ok else 1)
PY
done

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
