"""Our model code against transformers' own modelling classes: same checkpoint, same logits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

from areal.plugins.models.config import DecoderConfig
from areal.plugins.models.hf_io import load_model, safetensors_files, save_model

COMMON = dict(
    vocab_size=257,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)


def _hf_llama() -> transformers.PreTrainedModel:
    cfg = transformers.LlamaConfig(
        **COMMON,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    )
    return transformers.LlamaForCausalLM(cfg)


def _hf_qwen2() -> transformers.PreTrainedModel:
    cfg = transformers.Qwen2Config(**COMMON, tie_word_embeddings=True)
    return transformers.Qwen2ForCausalLM(cfg)


def _hf_qwen3() -> transformers.PreTrainedModel:
    cfg = transformers.Qwen3Config(**COMMON, head_dim=24)
    return transformers.Qwen3ForCausalLM(cfg)


def _hf_qwen3_moe() -> transformers.PreTrainedModel:
    cfg = transformers.Qwen3MoeConfig(
        **COMMON,
        head_dim=16,
        num_experts=6,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        mlp_only_layers=[1],
    )
    return transformers.Qwen3MoeForCausalLM(cfg)


def _hf_llama_biased() -> transformers.PreTrainedModel:
    """attention_bias puts a bias on q, k, v and o in Llama (and Qwen3)."""
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON, attention_bias=True))


BUILDERS = {
    "llama": _hf_llama,
    "llama_biased": _hf_llama_biased,
    "qwen2": _hf_qwen2,
    "qwen3": _hf_qwen3,
    "qwen3_moe": _hf_qwen3_moe,
}


def _perturb(model: torch.nn.Module, seed: int) -> None:
    """HF inits norms to 1 and biases to 0; randomise everything so each weight matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if p.dim() == 1 else 0.0))


@pytest.fixture(params=sorted(BUILDERS))
def hf_checkpoint(
    request: pytest.FixtureRequest, tmp_path: Path
) -> tuple[str, Path, torch.nn.Module]:
    torch.manual_seed(0)
    model = BUILDERS[request.param]().eval()
    _perturb(model, seed=1)
    model.save_pretrained(tmp_path / "hf")
    return request.param, tmp_path / "hf", model


def _ids(batch: int = 2, seq: int = 37) -> torch.Tensor:
    return torch.randint(
        0, COMMON["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(3)
    )


def test_logits_match_transformers(hf_checkpoint: tuple[str, Path, torch.nn.Module]) -> None:
    family, path, reference = hf_checkpoint
    ours = load_model(path)
    assert ours.family == family.removesuffix("_biased")
    ids = _ids()
    with torch.no_grad():
        expected = reference(ids).logits
        got = ours(ids)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_save_sharded_and_reload(
    hf_checkpoint: tuple[str, Path, torch.nn.Module], tmp_path: Path
) -> None:
    """Our writer's checkpoints load back into ours and into transformers, sharded or not."""
    _, path, reference = hf_checkpoint
    ours = load_model(path)
    out = tmp_path / "resaved"
    files = save_model(ours, out, max_shard_bytes=40_000)
    assert len(files) > 1 and (out / "model.safetensors.index.json").is_file()
    assert safetensors_files(out) == sorted(files)
    ids = _ids(1, 19)
    with torch.no_grad():
        expected = reference(ids).logits
        again = load_model(out)(ids)
        via_hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()(ids).logits
    torch.testing.assert_close(again, expected, atol=1e-4, rtol=0)
    torch.testing.assert_close(via_hf, expected, atol=1e-4, rtol=0)


def test_config_roundtrip_keeps_unknown_keys(tmp_path: Path) -> None:
    raw = {
        "model_type": "qwen2",
        "vocab_size": 10,
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "rope_theta": 1e6,
        "sliding_window": 4096,
    }
    cfg = DecoderConfig.from_hf_dict(raw)
    assert cfg.attention_bias and cfg.head_dim == 4 and cfg.num_key_value_heads == 2
    assert cfg.rope.theta == 1e6
    cfg.save(tmp_path)
    again = DecoderConfig.from_dir(tmp_path)
    assert again.extra["sliding_window"] == 4096
    assert again.to_hf_dict() == cfg.to_hf_dict()


def test_unsupported_model_type_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported; known: llama, qwen2"):
        DecoderConfig.from_hf_dict({"model_type": "gpt2"})


def test_loading_builds_on_meta_without_importing_dynamo(tmp_path: Path) -> None:
    """``load_model`` builds on the meta device and skips the values it would throw away there:
    the meta kernels of the embedding's random init and of the rotary table's division are
    Python references that import ``torch._dynamo`` (~1 s of an inference engine's start, which
    needs nothing else from it). Loaded in a fresh interpreter, as an engine does; the logits of
    what loads are checked against transformers by the tests above."""
    for family in ("llama", "qwen3_moe"):
        torch.manual_seed(0)
        BUILDERS[family]().save_pretrained(tmp_path / family)
    script = (
        "import sys, torch\n"
        "from areal.plugins.models.hf_io import load_model\n"
        "for path in sys.argv[1:]:\n"
        "    logits = load_model(path)(torch.tensor([[1, 2, 3]]))\n"
        "    assert bool(torch.isfinite(logits).all())\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    paths = [str(tmp_path / family) for family in ("llama", "qwen3_moe")]
    done = subprocess.run(
        [sys.executable, "-c", script, *paths], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
