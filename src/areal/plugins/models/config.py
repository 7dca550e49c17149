"""The decoder configuration read from (and written back to) a Hugging Face ``config.json``.

One dataclass covers the four built-in families; the family decides which switches it sets
(q/k/v bias for Qwen2, q/k norms for Qwen3, experts for Qwen3-MoE). Both the classic HF keys
(``rope_theta``, ``rope_scaling``) and transformers 5's ``rope_parameters`` are understood.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}


@dataclass
class RopeConfig:
    """Rotary embedding: ``kind`` is "default" or "llama3" (Llama 3.1+ frequency scaling)."""

    theta: float = 10000.0
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass
class DecoderConfig:
    """A plugin family for another Llama-like ``model_type`` subclasses this and sets
    ``architectures`` (``model_type -> HF class name``); see docs/models.md."""

    architectures: ClassVar[dict[str, str]] = ARCHITECTURES

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    rope: RopeConfig = field(default_factory=RopeConfig)
    attention_bias: bool = False  # q/k/v bias (Qwen2: always on)
    attention_out_bias: bool = False  # o_proj bias (Llama/Qwen3 with attention_bias; never Qwen2)
    mlp_bias: bool = False
    qk_norm: bool = False  # RMSNorm over each head of q and k (Qwen3)
    # mixture of experts (Qwen3-MoE); num_experts == 0 means dense
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = field(default_factory=list)
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    torch_dtype: str = "float32"
    # keys of the original config.json we do not interpret, written back unchanged on save
    extra: dict[str, Any] = field(default_factory=dict)

    def is_moe_layer(self, layer_idx: int) -> bool:
        return (
            self.num_experts > 0
            and layer_idx not in self.mlp_only_layers
            and (layer_idx + 1) % self.decoder_sparse_step == 0
        )

    @property
    def eos_token_ids(self) -> list[int]:
        if self.eos_token_id is None:
            return []
        if isinstance(self.eos_token_id, int):
            return [self.eos_token_id]
        return list(self.eos_token_id)

    # --- HF config.json ---------------------------------------------------------------------

    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any]) -> DecoderConfig:
        model_type = raw.get("model_type")
        if model_type not in cls.architectures:
            known = ", ".join(sorted(cls.architectures))
            raise ValueError(
                f"config.json model_type {model_type!r} is not supported; known: {known}"
            )
        heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        head_dim = raw.get("head_dim") or hidden // heads
        moe = model_type == "qwen3_moe"
        cfg = cls(
            model_type=model_type,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw.get("intermediate_size") or 0),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            hidden_act=raw.get("hidden_act", "silu"),
            rope=_rope_from_hf(raw),
            attention_bias=model_type == "qwen2" or bool(raw.get("attention_bias", False)),
            attention_out_bias=model_type != "qwen2" and bool(raw.get("attention_bias", False)),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            num_experts=int(raw.get("num_experts") or raw.get("num_local_experts") or 0)
            if moe
            else 0,
            num_experts_per_tok=int(raw.get("num_experts_per_tok") or 0) if moe else 0,
            moe_intermediate_size=int(raw.get("moe_intermediate_size") or 0) if moe else 0,
            norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
            decoder_sparse_step=int(raw.get("decoder_sparse_step") or 1),
            mlp_only_layers=list(raw.get("mlp_only_layers") or []),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_id=raw.get("eos_token_id"),
            pad_token_id=raw.get("pad_token_id"),
            torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
        )
        if cfg.hidden_act != "silu":
            raise ValueError(
                f"config.json hidden_act {cfg.hidden_act!r} is not supported (only silu)"
            )
        cfg.extra = {k: v for k, v in raw.items() if k not in cfg.to_hf_dict()}
        return cfg

    def to_hf_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "architectures": [self.architectures[self.model_type]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": self.hidden_act,
            "rope_theta": self.rope.theta,
            "rope_scaling": _rope_scaling_to_hf(self.rope),
            "attention_bias": self.attention_bias
            if self.model_type == "qwen2"
            else self.attention_out_bias,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "torch_dtype": self.torch_dtype,
        }
        if self.model_type == "llama":
            out["mlp_bias"] = self.mlp_bias
        if self.model_type == "qwen3_moe":
            out.update(
                num_experts=self.num_experts,
                num_experts_per_tok=self.num_experts_per_tok,
                moe_intermediate_size=self.moe_intermediate_size,
                norm_topk_prob=self.norm_topk_prob,
                decoder_sparse_step=self.decoder_sparse_step,
                mlp_only_layers=self.mlp_only_layers,
            )
        return out

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> DecoderConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"{model_dir} has no config.json (expected a Hugging Face model dir)"
            )
        return cls.from_hf_dict(json.loads(path.read_text()))

    def save(self, model_dir: str | Path) -> None:
        data = {**self.extra, **self.to_hf_dict()}
        Path(model_dir, "config.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _rope_from_hf(raw: dict[str, Any]) -> RopeConfig:
    # transformers 5 writes rope_parameters; released checkpoints carry rope_theta + rope_scaling.
    params = dict(raw.get("rope_parameters") or {})
    scaling = dict(raw.get("rope_scaling") or {})
    merged = {**scaling, **params}
    theta = float(merged.get("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = merged.get("rope_type") or merged.get("type") or "default"
    if kind not in ("default", "llama3"):
        raise ValueError(f"config.json rope type {kind!r} is not supported (default, llama3)")
    rope = RopeConfig(theta=theta, kind=kind)
    if kind == "llama3":
        rope.factor = float(merged["factor"])
        rope.low_freq_factor = float(merged.get("low_freq_factor", 1.0))
        rope.high_freq_factor = float(merged.get("high_freq_factor", 4.0))
        rope.original_max_position_embeddings = int(
            merged.get("original_max_position_embeddings", 8192)
        )
    return rope


def _rope_scaling_to_hf(rope: RopeConfig) -> dict[str, Any] | None:
    if rope.kind == "default":
        return None
    return {
        "rope_type": rope.kind,
        "factor": rope.factor,
        "low_freq_factor": rope.low_freq_factor,
        "high_freq_factor": rope.high_freq_factor,
        "original_max_position_embeddings": rope.original_max_position_embeddings,
    }
