"""The C++ decode attention kernel (``decode_kernel.py``) against attention written out by hand
over each row's own slots of the pool, its fused call against the model's own norms and rotary
embedding, and against bad input: a slot outside the pool, a row that reads nothing or more
than it lists, a wrong dtype or shape are errors that change nothing."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from areal.plugins.inference.embedded import decode_kernel
from areal.plugins.inference.embedded.engine import Engine, EngineConfig
from areal.plugins.models.config import RopeConfig
from areal.plugins.models.layers import RMSNorm, RotaryEmbedding, apply_rope
from areal.plugins.models.tiny import Qwen3ForCausalLM, tiny_config


@pytest.fixture(scope="module", autouse=True)
def _kernel() -> None:
    status = decode_kernel.load()
    assert status.loaded, status.detail  # `make setup` builds it; a machine without it fails here


def _case(
    rows: int, q_heads: int, kv_heads: int, dim: int, seed: int = 0
) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    slots = 512
    lens = torch.randint(1, 40, (rows,), generator=gen)
    span = int(lens.max())
    # each row's slots: distinct, scattered over the pool; padding reads slot 0
    order = torch.randperm(slots - 1, generator=gen)[: rows * span] + 1
    read = order.view(rows, span).clone()
    read[torch.arange(span)[None, :] >= lens[:, None]] = 0
    return {
        "q": torch.randn(rows, 1, q_heads, dim, generator=gen),
        "k_new": torch.randn(rows, 1, kv_heads, dim, generator=gen),
        "v_new": torch.randn(rows, 1, kv_heads, dim, generator=gen),
        "k_layer": torch.randn(slots, kv_heads, dim, generator=gen),
        "v_layer": torch.randn(slots, kv_heads, dim, generator=gen),
        "write": read[torch.arange(rows), lens - 1].clone(),  # the new token: each row's last
        "read": read,
        "lens": lens,
    }


def _by_hand(case: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The output, in float64, and the pool after the write."""
    k_layer, v_layer = case["k_layer"].clone(), case["v_layer"].clone()
    k_layer[case["write"]] = case["k_new"][:, 0]
    v_layer[case["write"]] = case["v_new"][:, 0]
    q = case["q"][:, 0].double()
    rows, q_heads, dim = q.shape
    group = q_heads // k_layer.shape[1]
    out = torch.empty(rows, q_heads, dim, dtype=torch.float64)
    for b in range(rows):
        mine = case["read"][b, : case["lens"][b]]
        for h in range(q_heads):
            keys = k_layer[mine, h // group].double()
            values = v_layer[mine, h // group].double()
            weights = (keys @ q[b, h] / math.sqrt(dim)).softmax(-1)
            out[b, h] = weights @ values
    return out[:, None], k_layer, v_layer


@pytest.mark.parametrize(
    ("q_heads", "kv_heads", "dim"),
    [(8, 4, 32), (4, 2, 16), (6, 2, 64), (4, 4, 128), (2, 1, 24)],
    ids=["gqa-32", "gqa-16", "gqa-3x-64", "mha-128", "gqa-24"],
)
def test_kernel_matches_attention_by_hand(q_heads: int, kv_heads: int, dim: int) -> None:
    case = _case(rows=9, q_heads=q_heads, kv_heads=kv_heads, dim=dim)
    expected, k_after, v_after = _by_hand(case)
    out = decode_kernel.attend(**case)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(case["k_layer"], k_after, atol=0, rtol=0)  # written in place
    torch.testing.assert_close(case["v_layer"], v_after, atol=0, rtol=0)


def _bad(case: dict[str, torch.Tensor], name: str) -> dict[str, torch.Tensor]:
    bad = dict(case)
    if name == "a slot outside the pool":
        bad["read"] = case["read"].clone()
        bad["read"][2, 0] = case["k_layer"].shape[0]
    elif name == "a write outside the pool":
        bad["write"] = case["write"].clone()
        bad["write"][1] = -1
    elif name == "a row reading nothing":
        bad["lens"] = case["lens"].clone()
        bad["lens"][3] = 0
    elif name == "a row reading past its slots":
        bad["lens"] = case["lens"].clone()
        bad["lens"][3] = case["read"].shape[1] + 1
    elif name == "float64":
        bad["q"] = case["q"].double()
    return bad


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("a slot outside the pool", "outside the pool"),
        ("a write outside the pool", "outside the pool"),
        ("a row reading nothing", "lens[3]"),
        ("a row reading past its slots", "lens[3]"),
        ("float64", "float32"),
    ],
)
def test_bad_input_is_an_error_that_changes_nothing(name: str, message: str) -> None:
    case = _case(rows=5, q_heads=8, kv_heads=4, dim=32, seed=1)
    pool = case["k_layer"].clone(), case["v_layer"].clone()
    with pytest.raises(RuntimeError, match=re.escape(message)):
        decode_kernel.attend(**_bad(case, name))
    assert torch.equal(case["k_layer"], pool[0]) and torch.equal(case["v_layer"], pool[1])


Norms = tuple[torch.Tensor, torch.Tensor, float] | None


def _rope_case(
    q_heads: int, kv_heads: int, dim: int, norms: bool, seed: int = 0
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor | Norms]]:
    """A decode step's call as the model makes it: q, k and v are views of one projection's
    output (rows strided), cos and sin of each row's position from the model's own rotary
    embedding, and (Qwen3) the per-head norms' weights."""
    rows = 7
    case = _case(rows=rows, q_heads=q_heads, kv_heads=kv_heads, dim=dim, seed=seed)
    gen = torch.Generator().manual_seed(seed + 100)
    fused = torch.randn(rows, 1, (q_heads + 2 * kv_heads) * dim, generator=gen)
    q, k, v = fused.split([q_heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    case["q"], case["k_new"], case["v_new"] = (
        q.view(rows, 1, q_heads, dim),
        k.view(rows, 1, kv_heads, dim),
        v.view(rows, 1, kv_heads, dim),
    )
    rotary = RotaryEmbedding(RopeConfig(theta=10000.0), dim)
    cos, sin = rotary(case["lens"].view(rows, 1) - 1, torch.float32)  # each row's new position
    weights = (torch.rand(dim, generator=gen) + 0.5, torch.rand(dim, generator=gen) + 0.5, 1e-6)
    return case, {"cos": cos, "sin": sin, "norms": weights if norms else None}


@pytest.mark.parametrize("norms", [True, False], ids=["qwen3-norms", "no-norms"])
@pytest.mark.parametrize(
    ("q_heads", "kv_heads", "dim"),
    [(8, 4, 32), (6, 2, 64), (4, 4, 128), (2, 1, 24)],
    ids=["gqa-32", "gqa-3x-64", "mha-128", "gqa-24"],
)
def test_fused_rope_kernel_matches_the_models_norms_rope_and_attention(
    q_heads: int, kv_heads: int, dim: int, norms: bool
) -> None:
    """The fused call against the model's own RMSNorm and apply_rope, then attention by hand."""
    case, rope = _rope_case(q_heads, kv_heads, dim, norms)
    q, k = case["q"], case["k_new"]
    cos, sin, weights = rope["cos"], rope["sin"], rope["norms"]
    assert isinstance(cos, torch.Tensor) and isinstance(sin, torch.Tensor)
    if isinstance(weights, tuple):
        q_norm, k_norm = RMSNorm(dim, weights[2]), RMSNorm(dim, weights[2])
        q_norm.weight.data, k_norm.weight.data = weights[0], weights[1]
        with torch.no_grad():
            q, k = q_norm(q), k_norm(k)
    expected, k_after, v_after = _by_hand(
        {**case, "q": apply_rope(q, cos, sin), "k_new": apply_rope(k, cos, sin)}
    )
    out = decode_kernel.attend_rope(**case, **rope)  # type: ignore[arg-type]
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(case["k_layer"], k_after, atol=1e-6, rtol=1e-5)  # roped keys
    torch.testing.assert_close(case["v_layer"], v_after, atol=0, rtol=0)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("cos of another head size", "cos and sin must be"),
        ("a norm of another size", "q_norm must be"),
        ("a bad write slot", "outside the pool"),
        ("keys for fewer rows", "k_new must be"),
    ],
)
def test_bad_input_to_the_fused_call_changes_nothing(name: str, message: str) -> None:
    case, rope = _rope_case(8, 4, 32, norms=True, seed=2)
    pool = case["k_layer"].clone(), case["v_layer"].clone()
    if name == "cos of another head size":
        cos, sin = rope["cos"], rope["sin"]
        assert isinstance(cos, torch.Tensor) and isinstance(sin, torch.Tensor)
        rope["cos"], rope["sin"] = cos[..., :16].contiguous(), sin[..., :16].contiguous()
    elif name == "a norm of another size":
        rope["norms"] = (torch.ones(16), torch.ones(32), 1e-6)
    elif name == "a bad write slot":
        case["write"] = case["write"].clone()
        case["write"][-1] = case["k_layer"].shape[0] + 5
    else:
        case["k_new"] = case["k_new"][:-1]
    with pytest.raises(RuntimeError, match=re.escape(message)):
        decode_kernel.attend_rope(**case, **rope)  # type: ignore[arg-type]
    assert torch.equal(case["k_layer"], pool[0]) and torch.equal(case["v_layer"], pool[1])


@pytest.mark.parametrize(
    "shape", [(16, 256), (2, 5, 64), (1, 24)], ids=["decode", "prefill", "one"]
)
def test_kernel_rms_norm_matches_the_models(shape: tuple[int, ...]) -> None:
    """The engine's one-call RMSNorm against the model's own module (torch's rms_norm), and
    a model whose norms use it gives the same logits."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(*shape, generator=gen) * 3
    norm = RMSNorm(shape[-1], 1e-6)
    norm.weight.data = torch.rand(shape[-1], generator=gen) + 0.5
    with torch.no_grad():
        expected = norm(x)
    out = torch.ops.areal_kernels.rms_norm(x, norm.weight, 1e-6)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    with pytest.raises(RuntimeError, match="weight must be"):
        torch.ops.areal_kernels.rms_norm(x, torch.ones(shape[-1] + 1), 1e-6)


def test_an_engine_models_norms_run_in_the_kernel_with_the_same_logits() -> None:
    model = Qwen3ForCausalLM(tiny_config("nano"))
    model.init_weights(generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        expected = model(ids)
        # 2 layers of 4 (before attention and the MLP, q and k), and the final norm
        assert decode_kernel.use_kernel_norms(model) == 2 * 4 + 1
        torch.testing.assert_close(model(ids), expected, atol=1e-5, rtol=1e-5)


def test_the_engine_uses_the_kernel_as_configured() -> None:
    """On by default, off when asked, and never for a pool that is not float32 (an error when
    asked for)."""
    model = Qwen3ForCausalLM(tiny_config("nano"))
    model.init_weights(generator=torch.Generator().manual_seed(0))
    on = Engine(model, lambda ids, skip: "", [], EngineConfig(max_total_tokens=64))
    assert on.decode_attention == {
        "kernel": True,
        "detail": decode_kernel.load().detail,
        "layers_in_one_call": True,  # a dense model's (test_layer_loop.py)
    }
    off = Engine(
        model, lambda ids, skip: "", [], EngineConfig(max_total_tokens=64, decode_kernel=False)
    )
    assert off.decode_attention["kernel"] is False
    assert off.decode_attention["layers_in_one_call"] is False
    assert "--no-decode-kernel" in off.decode_attention["detail"]
    model = model.to(torch.bfloat16)
    bf16 = Engine(model, lambda ids, skip: "", [], EngineConfig(max_total_tokens=64))
    assert bf16.decode_attention["kernel"] is False
    assert "float32" in bf16.decode_attention["detail"]
    with pytest.raises(RuntimeError, match=r"--decode-kernel: .*float32"):
        Engine(
            model, lambda ids, skip: "", [], EngineConfig(max_total_tokens=64, decode_kernel=True)
        )


def test_without_a_compiler_the_engine_falls_back_to_aten(tmp_path: Path) -> None:
    """A machine that cannot build the kernel (here: no C++ compiler where torch looks, and an
    empty extensions directory) gets ATen's attention and the reason, or an error when the
    kernel was asked for."""
    script = (
        "import torch\n"
        "from areal.plugins.inference.embedded.engine import _decode_attention\n"
        "print(repr(_decode_attention(None, torch.float32)))\n"
        "try:\n"
        "    _decode_attention(True, torch.float32)\n"
        "except RuntimeError as err:\n"
        "    print('error:', err)\n"
    )
    env = {
        **os.environ,
        "CXX": str(tmp_path / "no-such-compiler"),
        "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions"),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    fallback, error = done.stdout.strip().splitlines()
    assert fallback.startswith("{'kernel': False, 'detail': ")
    assert error.startswith("error: --decode-kernel: the decode attention kernel is unavailable")
    assert "could not be built" in done.stderr  # the log says why, once
