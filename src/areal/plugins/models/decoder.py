"""The decoder-only causal LM shared by Llama, Qwen2, Qwen3 and Qwen3-MoE.

Parameter names equal the Hugging Face checkpoint names (``model.layers.0.self_attn.q_proj.weight``)
except for stacked experts, which ``hf_io`` converts, so loading is a plain name lookup.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from areal.plugins.models.attention import AttentionBackend, CausalAttention
from areal.plugins.models.config import DecoderConfig
from areal.plugins.models.layers import (
    MLP,
    Attention,
    MoE,
    RMSNorm,
    RotaryEmbedding,
    building_on_meta,
)


class DecoderLayer(nn.Module):
    def __init__(self, config: DecoderConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp: nn.Module
        if config.is_moe_layer(layer_idx):
            self.mlp = MoE(config)
        else:
            self.mlp = MLP(config.hidden_size, config.intermediate_size, config.mlp_bias)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention: AttentionBackend
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attention)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderBody(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        shape = (config.vocab_size, config.hidden_size)
        # ``_weight``: no random init, which on the meta device is wasted (``building_on_meta``)
        self.embed_tokens = nn.Embedding(
            *shape, _weight=torch.empty(shape) if building_on_meta() else None
        )
        self.layers = nn.ModuleList(
            DecoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.rope, config.head_dim)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, attention)
        return self.norm(x)


class DecoderForCausalLM(nn.Module):
    """A causal LM over ``[batch, seq]`` token ids; subclasses name the family."""

    family: ClassVar[str] = ""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderBody(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        attention: AttentionBackend | None = None,
    ) -> torch.Tensor:
        """Final-norm hidden states [B, S, H]; positions default to 0..S-1 per row."""
        if positions is None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(
                input_ids
            )
        return self.model(input_ids, positions, attention or CausalAttention())

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        attention: AttentionBackend | None = None,
    ) -> torch.Tensor:
        """Logits [B, S, V]."""
        return self.lm_head(self.hidden_states(input_ids, positions, attention))

    def reset_buffers(self) -> None:
        """Rebuild non-persistent buffers (after construction on the meta device)."""
        self.model.rotary_emb.reset_parameters()

    def init_weights(self, std: float = 0.02, generator: torch.Generator | None = None) -> None:
        """Random init for fresh models (the embedded tiny default)."""
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            else:
                with torch.no_grad():
                    p.normal_(0.0, std, generator=generator)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
