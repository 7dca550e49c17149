"""How big the policy is, read from its ``config.json`` without torch, and the settings that are
areal's tiny-model values but wreck a real checkpoint.

The shipped configs carry the rates of areal's tiny model (1.3M parameters, random init): a
warm start at 3e-3 and RL at 1e-3. Pointed at a pretrained checkpoint they destroy it, and
fast: measured on SmolLM2-135M-Instruct, the quickstart's warm start at 3e-3 turned it into
gibberish in 3 steps, one RL step at 1e-3 wrecked it. Nothing fails, the run just learns from
noise, so ``areal config validate``, ``areal doctor`` and ``areal train`` (``--dry-run`` too)
warn with :func:`scale_warnings`: the key, the model's size, the fix.

The size is estimated from the decoder's shapes (embeddings, attention with grouped KV heads,
gated MLP, MoE experts, norms): exact for Llama/Qwen-style models up to biases. A Hub id is
read only from the local cache, never downloaded; a model ``model.init_tiny`` will create is
tiny by definition.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal.core.run_config import RunConfig

REAL_MODEL_PARAMS = 100_000_000  # above this, a checkpoint is treated as a real pretrained model
TINY_MODEL_RATE = 1e-4  # a learning rate at or above this is a tiny-model (random init) rate
SAFE_RATE = "≤ 1e-5"  # what to use instead, for a pretrained model (fine-tuning rates)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}  # model.dtype -> bytes a parameter


@dataclass(frozen=True)
class ModelScale:
    """The policy's estimated parameter count and the ``config.json`` it was read from."""

    params: int
    config_json: Path

    def described(self) -> str:
        """``135M-parameter model`` / ``7.6B-parameter model``."""
        if self.params >= 1_000_000_000:
            return f"{self.params / 1e9:.1f}B-parameter model"
        return f"{self.params / 1e6:.0f}M-parameter model"


def estimate_params(config: dict[str, Any]) -> int | None:
    """Parameters of a decoder from its Hugging Face ``config.json``; ``None`` when the shapes
    are missing (not a decoder this knows)."""
    text = config.get("text_config")
    if isinstance(text, dict):  # a multimodal checkpoint: its language model
        config = {**config, **text}
    try:
        hidden = int(config["hidden_size"])
        layers = int(config["num_hidden_layers"])
        vocab = int(config["vocab_size"])
        heads = int(config.get("num_attention_heads") or 1)
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        inter = int(config.get("intermediate_size") or 4 * hidden)
        experts = int(config.get("num_experts") or config.get("num_local_experts") or 0)
        expert_inter = int(config.get("moe_intermediate_size") or inter)
    except (KeyError, TypeError, ValueError):
        return None
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    family = str(config.get("model_type", ""))
    if config.get("attention_bias") or family == "qwen2":  # q, k, v biases
        attention += (heads + 2 * kv_heads) * head_dim
    if family.startswith("qwen3"):  # q_norm and k_norm
        attention += 2 * head_dim
    mlp = (
        experts * (3 * hidden * expert_inter) + hidden * experts if experts else 3 * hidden * inter
    )
    per_layer = attention + mlp + 2 * hidden  # two RMSNorms
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings", False) else 2)
    return layers * per_layer + embeddings + hidden  # + the final norm


def model_scale(config: RunConfig) -> ModelScale | None:
    """The policy's size, or ``None`` when it cannot be known without downloading or loading
    it (a Hub id not in the cache, no config.json) or is the tiny model ``init_tiny`` makes."""
    path = config.model.path
    local: str | None = path if Path(path).is_dir() else None
    if local is None and config.model.init_tiny is None:
        from areal.core.model_source import cached_model

        local = cached_model(path)  # the cache only: a check never downloads
    if local is None:
        return None
    config_json = Path(local) / "config.json"
    try:
        data = json.loads(config_json.read_text())
    except (OSError, ValueError):
        return None
    params = estimate_params(data) if isinstance(data, dict) else None
    return ModelScale(params, config_json) if params is not None else None


def scale_warnings(config: RunConfig, scale: ModelScale | None = None) -> list[str]:
    """Tiny-model learning rates on a real checkpoint, each as ``key: why; fix`` (as config
    validation words its findings). ``scale``: the model's size, when already read."""
    scale = scale or model_scale(config)
    if scale is None or scale.params <= REAL_MODEL_PARAMS:
        return []
    rates = [("train.learning_rate", config.train.learning_rate)]
    if config.warm_start.steps > 0:
        rates.append(("warm_start.learning_rate", config.warm_start.learning_rate))
    return [
        f"{key}: {_rate(rate)} is areal's tiny-model rate; on a {scale.described()} "
        f"({scale.config_json}) it wrecks the pretrained weights within a few steps; use "
        f"{SAFE_RATE}, e.g. --set {key}=1e-5"
        for key, rate in rates
        if rate >= TINY_MODEL_RATE
    ]


def _rate(value: float) -> str:
    """``0.001`` -> ``1e-3``, ``0.0025`` -> ``2.5e-3``: rates as configs write them."""
    mantissa, exponent = f"{value:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
