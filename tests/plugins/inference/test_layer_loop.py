"""An eager decode step's decoder layers in one C++ call (``decode_kernel.LayerLoop``): each row
gets the hidden state the model's own modules give its sequence alone without a cache (the
modules `tests/plugins/models` checks against transformers), on packed and plain weights, with
and without Qwen3's q/k norms and Qwen2/Llama-style biases; the pool is written as the modules
write it; a weight written in place is seen at the next step; a model it cannot run is left
to its modules; bad arguments fail before anything is written. End to end, the real server's
concurrent requests decode through it to transformers' own log-probs of the checkpoint."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

from areal.plugins.inference.embedded import decode_kernel
from areal.plugins.inference.embedded.engine import Engine, EngineConfig
from areal.plugins.inference.embedded.kv_pool import TokenKVPool
from areal.plugins.inference.embedded.packed_linear import PackedWeights
from areal.plugins.inference.embedded.paged_attention import PagedAttention, build_step
from areal.plugins.models.decoder import DecoderForCausalLM
from areal.plugins.models.hf_io import copy_weights
from areal.plugins.models.tiny import Qwen3ForCausalLM, tiny_config
from support.engines import RunningServer, alone, prefilled, reference_logprobs

pytestmark = pytest.mark.skipif(not decode_kernel.load().loaded, reason="no C++ compiler")

BIASED = ("attention_bias", "attention_out_bias", "mlp_bias")
VARIANTS: dict[str, dict[str, Any]] = {
    "qwen3": {},  # q/k norms, no biases
    "biased": {"qk_norm": False, **dict.fromkeys(BIASED, True)},  # Qwen2/Llama-style
}


def _model(**config: Any) -> DecoderForCausalLM:
    model = Qwen3ForCausalLM(dataclasses.replace(tiny_config("nano"), **config)).eval()
    model.init_weights(generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # init_weights zeroes biases and sets norms to one: make them count
        for name, p in model.named_parameters():
            if name.endswith((".bias", "norm.weight")):
                p.copy_(torch.linspace(0.5, 1.5, p.numel()))
    return model


def _decode(
    loop: decode_kernel.LayerLoop,
    pool: TokenKVPool,
    seqs: list[list[int]],
    slots: list[torch.Tensor],
    cached: list[int],
) -> tuple[torch.Tensor, PagedAttention]:
    ids, positions, attention = build_step(
        pool, slots, cached, [[s[-1]] for s in seqs], kernel=True
    )
    assert attention.slots is not None
    with torch.inference_mode():
        return loop.hidden_states(ids, positions, attention.slots), attention


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "plain"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_row_is_what_the_modules_give_its_sequence_alone(variant: str, packed: bool) -> None:
    model = _model(**VARIANTS[variant])
    if packed:
        PackedWeights(model)
    loop = decode_kernel.LayerLoop.of(model)
    assert loop is not None and loop.packed == packed
    pool = TokenKVPool(model.config, 1024)
    cached = [30, 5, 12, 3, 29]
    seqs, slots = prefilled(model, pool, cached)
    hidden, attention = _decode(loop, pool, seqs, slots, cached)
    assert hidden.shape == (len(seqs), 1, model.config.hidden_size)
    for row, seq in enumerate(seqs):
        torch.testing.assert_close(hidden[row, 0], alone(model, seq)[-1], atol=2e-5, rtol=0)
    # The new tokens' keys and values went where the modules' own decode step puts them.
    written = attention.write_slots
    new_k = [layer[written].clone() for layer in pool.k]
    new_v = [layer[written].clone() for layer in pool.v]
    with torch.inference_mode():
        ids, positions, modules = build_step(pool, slots, cached, [[s[-1]] for s in seqs])
        model.hidden_states(ids, positions, modules)
    for mine, theirs in zip((*new_k, *new_v), (*pool.k, *pool.v), strict=True):
        torch.testing.assert_close(mine, theirs[written], atol=2e-5, rtol=0)


def test_a_weight_written_in_place_is_seen_at_the_next_step() -> None:
    """The engine's weight updates copy into the parameters (then re-pack): the loop reads the
    modules' weights at every step, so the step after an update uses the new ones."""
    model = _model()
    packs = PackedWeights(model)
    loop = decode_kernel.LayerLoop.of(model)
    assert loop is not None
    pool = TokenKVPool(model.config, 1024)
    seqs, slots = prefilled(model, pool, [7, 9])
    before, _ = _decode(loop, pool, seqs, slots, [7, 9])
    changed = {
        name: p.detach() * 1.5
        for name, p in model.state_dict().items()
        if name.startswith("model.layers.1.") and name.endswith(("o_proj.weight", "up_proj.weight"))
    }
    copy_weights(model, changed)
    assert packs.refresh() == 2
    after, _ = _decode(loop, pool, seqs, slots, [7, 9])
    assert not torch.allclose(after, before, atol=1e-3)
    # The cache holds keys of the old weights for the prompt; the reference is the modules over
    # the same cache, which is what the engine's next step would compute.
    with torch.inference_mode():
        ids, positions, attention = build_step(pool, slots, [7, 9], [[s[-1]] for s in seqs])
        expected = model.hidden_states(ids, positions, attention)
    torch.testing.assert_close(after, expected, atol=2e-5, rtol=0)


def test_a_model_the_loop_cannot_run_is_left_to_its_modules() -> None:
    moe = Qwen3ForCausalLM(
        dataclasses.replace(
            tiny_config("nano"), num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32
        )
    )
    assert decode_kernel.LayerLoop.of(moe) is None
    assert decode_kernel.LayerLoop.of(_model().to(torch.bfloat16)) is None
    engine = Engine(moe, lambda ids, skip: "", [], EngineConfig(max_total_tokens=64))
    assert engine.decode_attention["kernel"] is True
    assert engine.decode_attention["layers_in_one_call"] is False


def test_bad_arguments_fail_before_anything_is_written() -> None:
    model = _model()
    loop = decode_kernel.LayerLoop.of(model)
    assert loop is not None
    pool = TokenKVPool(model.config, 1024)
    seqs, slots = prefilled(model, pool, [4, 6])
    _, _, attention = build_step(pool, slots, [4, 6], [[s[-1]] for s in seqs], kernel=True)
    kernel_slots = attention.slots
    assert kernel_slots is not None
    snapshot = [t.clone() for t in (*pool.k, *pool.v)]
    weights, biases, groups, norms, qk_norms = loop.arguments()
    x = torch.zeros(2, model.config.hidden_size)
    cos = sin = torch.zeros(2, model.config.head_dim)
    common = (kernel_slots.k, kernel_slots.v, kernel_slots.write, kernel_slots.read,
              kernel_slots.lens, cos, sin, 1e-6, 1e-6, False)  # fmt: skip
    call = torch.ops.areal_kernels.decode_layers
    with pytest.raises(RuntimeError, match="expected 14 linear weights for 2 layers, got 13"):
        call(x, weights[:-1], biases[:-1], groups, norms, qk_norms, *common)
    with pytest.raises(RuntimeError, match="q/k/v come from 1 or 3 linears"):
        call(x, weights, biases, [2, 2, 3, 2], norms, qk_norms, *common)
    with pytest.raises(RuntimeError, match="two entries a layer"):
        call(x, weights, biases, groups, norms[:-1], qk_norms, *common)
    bad_read = kernel_slots.read.clone()
    bad_read[1, 0] = 10**6
    with pytest.raises(RuntimeError, match="outside the pool"):
        call(x, weights, biases, groups, norms, qk_norms, kernel_slots.k, kernel_slots.v,
             kernel_slots.write, bad_read, *common[4:])  # fmt: skip
    for before, after in zip(snapshot, (*pool.k, *pool.v), strict=True):
        assert torch.equal(before, after)


def test_the_servers_concurrent_requests_decode_to_transformers_log_probs(
    server: RunningServer, nano_model_dir: str
) -> None:
    """Four sampled requests at once, so decode steps carry several rows through the loop; each
    token's log-prob is transformers' (``AutoModelForCausalLM`` on the same checkpoint)."""
    info = server.http.get("/server_info").json()
    assert info["decode_attention"]["layers_in_one_call"] is True, info["decode_attention"]
    steps_before = info["decode_steps"]
    prompts = [[11, 402, 77], [5, 6, 7, 8, 9, 10, 11], [300, 301], [42] * 12]
    body = {"sampling_params": {"max_new_tokens": 16, "temperature": 1.0, "ignore_eos": True},
            "return_logprob": True}  # fmt: skip
    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(lambda ids: server.generate(input_ids=ids, **body), prompts))
    info = server.http.get("/server_info").json()
    assert info["decode_mean_batch"] > 1 and info["decode_steps"] > steps_before
    for prompt, answer in zip(prompts, answers, strict=True):
        output = answer["output_ids"]
        assert len(output) == 16
        expected = reference_logprobs(nano_model_dir, prompt + output, len(prompt))
        served = answer["meta_info"]["output_token_logprobs"]
        for i, (logprob, token, _) in enumerate(served):
            assert token == output[i]
            assert logprob == pytest.approx(float(expected[i, token]), abs=1e-3)
