"""The embedded default: a small Qwen3-style model (random init) plus a real tokenizer, offline."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from areal.plugins.models.config import DecoderConfig, RopeConfig
from areal.plugins.models.hf_io import save_model
from areal.plugins.models.qwen3 import Qwen3ForCausalLM
from areal.plugins.models.tokenizer import build_tokenizer, special_token_ids

VOCAB_SIZE = 4096

# name -> (hidden, layers, heads, kv_heads, head_dim, intermediate)
SIZES: dict[str, tuple[int, int, int, int, int, int]] = {
    "nano": (64, 2, 4, 2, 16, 192),  # ~0.4M params: unit tests
    "tiny": (128, 4, 4, 2, 32, 384),  # ~1.3M params: the CPU demo
    "small": (256, 10, 8, 4, 32, 768),  # ~9M params: benchmarks
}


def tiny_config(size: str) -> DecoderConfig:
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of: {', '.join(SIZES)}")
    hidden, layers, heads, kv_heads, head_dim, inter = SIZES[size]
    ids = special_token_ids()
    return DecoderConfig(
        model_type="qwen3",
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        rope=RopeConfig(theta=1_000_000.0),
        qk_norm=True,
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        torch_dtype="float32",
    )


def init_tiny(
    out_dir: str | Path, size: str = "tiny", seed: int = 0, force: bool = False
) -> dict[str, Any]:
    """Write a Hugging Face directory (config, safetensors, tokenizer, generation config)."""
    out = Path(out_dir)
    config = tiny_config(size)  # a bad size fails before anything is removed
    if out.exists() and any(out.iterdir()):
        if not force:
            raise FileExistsError(f"{out} is not empty (use --force to overwrite)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    model = Qwen3ForCausalLM(config)
    model.init_weights(generator=torch.Generator().manual_seed(seed))
    save_model(model, out)
    build_tokenizer(out, vocab_size=VOCAB_SIZE)
    generation = {"eos_token_id": config.eos_token_id, "pad_token_id": config.pad_token_id}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    return {
        "path": str(out.resolve()),
        "family": config.model_type,
        "size": size,
        "parameters": model.num_parameters(),
        "vocab_size": config.vocab_size,
        "seed": seed,
    }
