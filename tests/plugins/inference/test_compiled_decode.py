"""The compiled decode step (``--compile-decode``) and the linear layers on pre-packed weights
(``EngineConfig.pack_weights=True``) compute what the eager step on the parameters
computes: the same greedy tokens and log-probs for batches of one and of several rows as their keys
grow, the same after weights are loaded or written in place (a stale pack would be a silent wrong
answer), and steps the compiled step does not cover (rows in several buckets) run eagerly. One
compile (warm_up) serves every batch size and span: a recompile fails the test. The reference
attends with ATen; the engines under test with the C++ decode kernel (decode_kernel.py), and one
compiled engine with ATen too."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from areal.plugins.inference.embedded.compiled_decode import CompiledDecode
from areal.plugins.inference.embedded.engine import Engine, EngineConfig
from areal.plugins.inference.embedded.packed_linear import PackedLinear
from areal.plugins.inference.embedded.requests import Emit, SequenceRequest
from areal.plugins.inference.embedded.schema import SamplingParams
from areal.plugins.models.tiny import Qwen3ForCausalLM, tiny_config


def _engine(
    compile_decode: bool, pack_weights: bool = True, decode_kernel: bool | None = None
) -> Engine:
    model = Qwen3ForCausalLM(tiny_config("nano"))
    model.init_weights(generator=torch.Generator().manual_seed(0))
    config = EngineConfig(
        max_total_tokens=4096,
        compile_decode=compile_decode,
        pack_weights=pack_weights,
        decode_kernel=decode_kernel,
    )
    return Engine(model, lambda ids, skip: "", [], config)


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[Engine, Engine, Engine]]:
    """The reference (eager, torch's own linear, ATen's attention), the eager step and the
    compiled step (both on packed weights and the decode kernel)."""
    stance = CompiledDecode.stance
    CompiledDecode.stance = "fail_on_recompile"
    try:
        yield (
            _engine(False, pack_weights=False, decode_kernel=False),
            _engine(False, decode_kernel=True),
            _engine(True, decode_kernel=True),
        )
    finally:
        CompiledDecode.stance = stance


@pytest.fixture(scope="module")
def aten_compiled() -> Iterator[Engine]:
    """A compiled step that attends with ATen (the decode kernel off)."""
    stance = CompiledDecode.stance
    CompiledDecode.stance = "fail_on_recompile"
    try:
        yield _engine(True, decode_kernel=False)
    finally:
        CompiledDecode.stance = stance


def _generate(engine: Engine, prompts: list[list[int]], new_tokens: int) -> list[dict[str, Any]]:
    """Run ``prompts`` to completion on the calling thread (greedy); each one's final payload."""
    out: dict[int, dict[str, Any]] = {}
    for i, prompt in enumerate(prompts):
        req = SequenceRequest(
            rid=str(i),
            input_ids=prompt,
            params=SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True),
            return_logprob=True,
        )
        engine._enqueue(req, _keep_final(out, i))
    engine._admit()
    while engine.running:
        prefill = [s for s in engine.running if s.kv_len == 0]
        if prefill:  # an empty prefill batch is not a step (the engine's loop never runs one)
            engine._timed("prefill", prefill)
        decode = [s for s in engine.running if s.kv_len > 0]
        if decode:
            engine._timed("decode", decode)
    return [out[i] for i in range(len(prompts))]


def _keep_final(out: dict[int, dict[str, Any]], i: int) -> Emit:
    def emit(payload: dict[str, Any], final: bool) -> None:
        if final:
            out[i] = payload

    return emit


def _assert_same(eager: list[dict[str, Any]], compiled: list[dict[str, Any]]) -> None:
    for a, b in zip(eager, compiled, strict=True):
        assert a["output_ids"] == b["output_ids"]
        logprobs_a = torch.tensor([lp for lp, _, _ in a["meta_info"]["output_token_logprobs"]])
        logprobs_b = torch.tensor([lp for lp, _, _ in b["meta_info"]["output_token_logprobs"]])
        torch.testing.assert_close(logprobs_b, logprobs_a, atol=2e-5, rtol=0)


def _prompts(lengths: list[int], seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(10, 4000, (n,), generator=g).tolist() for n in lengths]


def test_engines_under_test_pack_as_configured(engines: tuple[Engine, Engine, Engine]) -> None:
    reference, eager, compiled = engines
    assert reference.decode_attention["kernel"] is False
    assert eager.decode_attention["kernel"] and compiled.decode_attention["kernel"]
    assert reference._prepacked is None
    assert not any(isinstance(m, PackedLinear) for m in reference.model.modules())
    for engine in (eager, compiled):
        assert engine._prepacked is not None
        layers = engine.model.model.layers
        assert all(isinstance(layer.self_attn.qkv_proj, PackedLinear) for layer in layers)
        assert all(isinstance(layer.mlp.gate_up_proj, PackedLinear) for layer in layers)
        assert isinstance(engine.model.lm_head, PackedLinear)


@pytest.mark.parametrize("lengths", [[5], [7, 9, 8, 12, 10, 6, 11, 9]])
def test_compiled_decode_matches_the_eager_step(
    engines: tuple[Engine, Engine, Engine], lengths: list[int]
) -> None:
    reference, eager, compiled = engines
    prompts = _prompts(lengths, seed=len(lengths))
    decode_steps = compiled.timings["decode"][0]
    expected = _generate(reference, prompts, 24)
    _assert_same(expected, _generate(eager, prompts, 24))
    _assert_same(expected, _generate(compiled, prompts, 24))
    assert compiled.timings["decode"][0] > decode_steps


def _perturbed(engine: Engine, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        name: p.detach() + 0.05 * torch.randn(p.shape, generator=g)
        for name, p in engine.model.state_dict().items()
    }


def test_compiled_decode_sees_weights_loaded(engines: tuple[Engine, Engine, Engine]) -> None:
    """``load_weights`` (every HTTP weight update ends in it) copies into the parameters: the
    packed copies follow, in the eager and in the compiled step."""
    reference, eager, compiled = engines
    prompts = _prompts([6, 9, 7], seed=3)
    before = _generate(compiled, prompts, 16)
    update = _perturbed(compiled, seed=5)
    for engine in engines:
        engine.load_weights(update, None)
    after = _generate(compiled, prompts, 16)
    assert [r["output_ids"] for r in after] != [r["output_ids"] for r in before]
    expected = _generate(reference, prompts, 16)
    _assert_same(expected, after)
    _assert_same(expected, _generate(eager, prompts, 16))


def test_packed_weights_follow_any_in_place_write(engines: tuple[Engine, Engine, Engine]) -> None:
    """Not only ``load_weights``: a write into one parameter by any path, here a single tensor
    (the tied embedding / LM head) scaled in place, re-packs before the next step. The MLP's
    write is large (×30): a fresh random nano model echoes its last prompt token (its tied
    embedding and head agree with themselves whatever their sign), and ×3 left that echo, so
    the test failed when it ran before the others had loaded other weights."""
    reference, eager, compiled = engines
    prompts = _prompts([8, 5], seed=6)
    before = _generate(compiled, prompts, 12)
    for engine in engines:
        with torch.no_grad():
            engine.model.lm_head.weight.mul_(-1.0)
            engine.model.model.layers[0].mlp.down_proj.weight.mul_(30.0)
    after = _generate(compiled, prompts, 12)
    assert [r["output_ids"] for r in after] != [r["output_ids"] for r in before]
    expected = _generate(reference, prompts, 12)
    _assert_same(expected, after)
    _assert_same(expected, _generate(eager, prompts, 12))


def _count_calls(step: CompiledDecode, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    compiled_fn = step._fn

    def counting(*args: Any) -> torch.Tensor:
        calls[0] += 1
        out: torch.Tensor = compiled_fn(*args)
        return out

    monkeypatch.setattr(step, "_fn", counting)
    return calls


def test_rows_of_very_different_lengths_run_eagerly_with_aten(
    aten_compiled: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ATen's attention, rows in several buckets are outside the compiled step: the eager
    one runs them. (A reference of its own: the other tests change their engines' weights.)"""
    reference = _engine(False, pack_weights=False, decode_kernel=False)
    assert aten_compiled._compiled is not None
    calls = _count_calls(aten_compiled._compiled, monkeypatch)
    prompts = _prompts([4, 60, 5], seed=4)
    _assert_same(_generate(reference, prompts, 8), _generate(aten_compiled, prompts, 8))
    assert calls[0] == 0  # every step had rows in two buckets
    _generate(aten_compiled, prompts[:1], 2)
    assert calls[0] == 1  # one row: compiled


def test_rows_of_very_different_lengths_run_compiled_with_the_kernel(
    engines: tuple[Engine, Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel reads each row's own slots, so such rows need no buckets: every decode step
    runs compiled, with the same tokens as the reference."""
    reference, _, compiled = engines
    assert compiled._compiled is not None
    calls = _count_calls(compiled._compiled, monkeypatch)
    prompts = _prompts([4, 60, 5], seed=4)
    _assert_same(_generate(reference, prompts, 8), _generate(compiled, prompts, 8))
    assert calls[0] == 7  # 8 new tokens: the first from the prefill, 7 decode steps
