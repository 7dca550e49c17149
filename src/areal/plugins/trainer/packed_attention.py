"""Causal attention over a packed row that never looks across a sample boundary.

The mask is block-diagonal causal, ``[1, 1, N, N]`` booleans, built once per batch and shared by
every layer. It costs N² bytes, which is fine for the CPU trainer's packs (a few thousand tokens);
a GPU backend would use varlen flash attention on ``cu_seqlens`` instead, behind the same
:class:`~areal.plugins.models.attention.AttentionBackend` seam.
"""

from __future__ import annotations

import torch
from torch import Tensor

from areal.plugins.models.attention import masked_attention

__all__ = ["PackedCausalAttention", "block_causal_mask"]


def block_causal_mask(cu_seqlens: Tensor) -> Tensor:
    """``[1, 1, N, N]`` bool, True where query i may attend key j: same sample and j <= i."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    n = int(cu_seqlens[-1])
    seq_id = torch.repeat_interleave(
        torch.arange(lengths.numel(), device=cu_seqlens.device), lengths
    )
    same = seq_id[:, None] == seq_id[None, :]
    causal = torch.ones(n, n, dtype=torch.bool, device=cu_seqlens.device).tril()
    return (same & causal)[None, None]


class PackedCausalAttention:
    """An ``AttentionBackend`` for one packed ``[1, N]`` row described by ``cu_seqlens``."""

    def __init__(self, cu_seqlens: Tensor) -> None:
        self.cu_seqlens = cu_seqlens
        self.mask = block_causal_mask(cu_seqlens)

    def attend(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if q.shape[0] != 1 or q.shape[1] != self.mask.shape[-1]:
            raise ValueError(
                f"packed attention expects q of shape [1, {self.mask.shape[-1]}, H, D]; "
                f"got {tuple(q.shape)}"
            )
        return masked_attention(q, k, v, self.mask)
