"""The compiled decode step (``--compile-decode``) computes what the eager step computes: the same
greedy tokens and log-probs for batches of one and of several rows as their keys grow, the same
after weights are copied in place, and steps it does not cover (rows in several buckets) run
eagerly. One compile (warm_up) serves every batch size and span: a recompile fails the test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from areal.plugins.inference.embedded.compiled_decode import CompiledDecode
from areal.plugins.inference.embedded.engine import Engine, EngineConfig
from areal.plugins.inference.embedded.requests import Emit, SequenceRequest
from areal.plugins.inference.embedded.schema import SamplingParams
from areal.plugins.models.tiny import Qwen3ForCausalLM, tiny_config


def _engine(compile_decode: bool) -> Engine:
    model = Qwen3ForCausalLM(tiny_config("nano"))
    model.init_weights(generator=torch.Generator().manual_seed(0))
    config = EngineConfig(max_total_tokens=4096, compile_decode=compile_decode)
    return Engine(model, lambda ids, skip: "", [], config)


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[Engine, Engine]]:
    stance = CompiledDecode.stance
    CompiledDecode.stance = "fail_on_recompile"
    try:
        yield _engine(False), _engine(True)
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
        engine._timed("prefill", [s for s in engine.running if s.kv_len == 0])
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


@pytest.mark.parametrize("lengths", [[5], [7, 9, 8, 12, 10, 6, 11, 9]])
def test_compiled_decode_matches_the_eager_step(
    engines: tuple[Engine, Engine], lengths: list[int]
) -> None:
    eager, compiled = engines
    prompts = _prompts(lengths, seed=len(lengths))
    decode_steps = compiled.timings["decode"][0]
    _assert_same(_generate(eager, prompts, 24), _generate(compiled, prompts, 24))
    assert compiled.timings["decode"][0] > decode_steps


def test_compiled_decode_sees_weights_copied_in_place(engines: tuple[Engine, Engine]) -> None:
    eager, compiled = engines
    prompts = _prompts([6, 9, 7], seed=3)
    before = _generate(compiled, prompts, 16)
    g = torch.Generator().manual_seed(5)
    update = {
        name: p.detach() + 0.05 * torch.randn(p.shape, generator=g)
        for name, p in compiled.model.state_dict().items()
    }
    for engine in engines:
        engine.load_weights(update, None)
    after = _generate(compiled, prompts, 16)
    assert [r["output_ids"] for r in after] != [r["output_ids"] for r in before]
    _assert_same(_generate(eager, prompts, 16), after)


def test_rows_of_very_different_lengths_run_eagerly(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows in several buckets are outside the compiled step: the eager one runs them."""
    eager, compiled = engines
    step = compiled._compiled
    assert step is not None
    calls = 0
    compiled_fn = step._fn

    def counting(*args: Any) -> torch.Tensor:
        nonlocal calls
        calls += 1
        out: torch.Tensor = compiled_fn(*args)
        return out

    monkeypatch.setattr(step, "_fn", counting)
    prompts = _prompts([4, 60, 5], seed=4)
    _assert_same(_generate(eager, prompts, 8), _generate(compiled, prompts, 8))
    assert calls == 0  # every step had rows in two buckets
    _generate(compiled, prompts[:1], 2)
    assert calls == 1  # one row: compiled
