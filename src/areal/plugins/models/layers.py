"""Building blocks shared by the decoder families: RMSNorm, rotary embedding, attention, MLPs."""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from areal.plugins.models.attention import AttentionBackend, FusedRopeBackend
from areal.plugins.models.config import DecoderConfig, RopeConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            # one fused kernel instead of six ops; the same math as below in fp32
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def building_on_meta() -> bool:
    """Whether modules are being built on the meta device (``with torch.device("meta")``):
    shapes only; memory comes with ``to_empty``, values with a load or ``reset_buffers``.

    Such a build skips the values it would compute: they are thrown away, and the meta kernels
    of some ops (``normal_``, division) are Python references whose wrapper imports
    ``torch._dynamo``, ~1 s of an inference engine's start that nothing else there needs."""
    return torch.get_default_device().type == "meta"


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Inverse frequencies, with Llama 3.1's smooth long-context scaling when asked for."""
    inv_freq = 1.0 / (
        rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    )
    if rope.kind != "llama3":
        return inv_freq
    low_wavelen = rope.original_max_position_embeddings / rope.low_freq_factor
    high_wavelen = rope.original_max_position_embeddings / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (rope.original_max_position_embeddings / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    inv_freq: torch.Tensor

    def __init__(self, rope: RopeConfig, head_dim: int) -> None:
        super().__init__()
        self.rope = rope
        self.head_dim = head_dim
        table = torch.empty(head_dim // 2) if building_on_meta() else rope_inv_freq(rope, head_dim)
        self.register_buffer("inv_freq", table, persistent=False)

    def reset_parameters(self) -> None:
        """Recompute the (non-persistent) frequencies, e.g. after building on the meta device."""
        self.inv_freq = rope_inv_freq(self.rope, self.head_dim).to(self.inv_freq.device)

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape [B, S, D] for integer positions [B, S]."""
        freqs = positions.float()[..., None] * self.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, S, H, D]; cos, sin: [B, S, D] (rotate-half convention of HF checkpoints)."""
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    # Set only by an inference engine (embedded/packed_linear.py): q, k and v from one GEMM.
    qkv_proj: nn.Module

    def __init__(self, config: DecoderConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        hidden, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(hidden, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.n_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(
            self.n_heads * self.head_dim, hidden, bias=config.attention_out_bias
        )
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention: AttentionBackend,
    ) -> torch.Tensor:
        b, s, _ = x.shape
        if hasattr(self, "qkv_proj"):  # one GEMM for the three, set by an inference engine
            q, k, v = self.qkv_proj(x)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(b, s, -1, self.head_dim)
        k = k.view(b, s, -1, self.head_dim)
        v = v.view(b, s, -1, self.head_dim)
        if getattr(attention, "fuses_rope", False):  # the norms and RoPE in the backend's call
            norms = (
                (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
                if hasattr(self, "q_norm")
                else None
            )
            fused = cast(FusedRopeBackend, attention)
            out = fused.attend_rope(self.layer_idx, q, k, v, cos, sin, norms)
            return self.o_proj(out.reshape(b, s, -1))
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attention.attend(self.layer_idx, q, k, v)
        return self.o_proj(out.reshape(b, s, -1))


class MLP(nn.Module):
    """SwiGLU feed-forward."""

    # Set only by an inference engine (embedded/packed_linear.py): gate and up from one GEMM.
    gate_up_proj: nn.Module

    def __init__(self, hidden: int, intermediate: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "gate_up_proj"):  # one GEMM for the two, set by an inference engine
            gate, up = self.gate_up_proj(x)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


class Experts(nn.Module):
    """All experts' SwiGLU weights stacked in 3-D tensors [E, out, in] (one tensor per projection,
    so expert parallelism can shard dim 0 later)."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Parameter(torch.empty(num_experts, intermediate, hidden))
        self.up_proj = nn.Parameter(torch.empty(num_experts, intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))
        if not building_on_meta():
            for p in (self.gate_proj, self.up_proj, self.down_proj):
                nn.init.normal_(p, std=0.02)

    def forward(
        self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """x: [T, H]; expert_ids, weights: [T, K]. Loops over the experts that got tokens.

        Under expert parallelism the weights are sharded DTensors and the ids local to this rank's
        shard (the trainer routes the tokens); the loop then runs on the local shard.
        """
        gate_w, up_w, down_w = (_local(p) for p in (self.gate_proj, self.up_proj, self.down_proj))
        out = torch.zeros_like(x)
        flat_ids = expert_ids.reshape(-1)
        token_of = torch.arange(x.shape[0], device=x.device).repeat_interleave(expert_ids.shape[1])
        order = torch.argsort(flat_ids, stable=True)
        counts = torch.bincount(flat_ids, minlength=gate_w.shape[0]).tolist()
        flat_w = weights.reshape(-1)
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            sel = order[start : start + n]
            start += n
            tokens = token_of[sel]
            h = x[tokens]
            h = F.silu(h @ gate_w[e].t()) * (h @ up_w[e].t())
            h = (h @ down_w[e].t()) * flat_w[sel, None].to(h.dtype)
            out.index_add_(0, tokens, h)
        return out


def _local(weight: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a weight sharded from outside (a DTensor), else the weight itself."""
    to_local = getattr(weight, "to_local", None)
    return to_local() if callable(to_local) else weight


class MoE(nn.Module):
    """Top-k routed experts (Qwen3-MoE): softmax router, optional renormalisation of the top k."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = Experts(config.num_experts, config.hidden_size, config.moe_intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        probs = torch.softmax(self.gate(flat).float(), dim=-1)
        weights, expert_ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return self.experts(flat, expert_ids, weights.to(x.dtype)).reshape(shape)
