"""The engine's ``AttentionBackend``: write new k/v into pool slots, attend over each row's slots."""

from __future__ import annotations

import torch

from areal.plugins.inference.embedded.kv_pool import TokenKVPool
from areal.plugins.models.attention import masked_attention


class PagedAttention:
    """One forward step over a batch of sequences that each own a list of KV slots.

    ``write_slots`` [B, S] are the slots of the step's new tokens (padding writes slot 0);
    ``read_slots`` [B, L] all slots each row attends over; ``mask`` [B, 1, S, L] is causal and
    hides padding. The mask is built once per step and shared by every layer.
    """

    def __init__(
        self,
        pool: TokenKVPool,
        write_slots: torch.Tensor,
        read_slots: torch.Tensor,
        mask: torch.Tensor,
    ) -> None:
        self.pool = pool
        self.write_slots = write_slots
        self.read_slots = read_slots
        self.mask = mask

    def attend(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        k_layer, v_layer = self.pool.k[layer_idx], self.pool.v[layer_idx]
        k_layer[self.write_slots] = k.to(k_layer.dtype)
        v_layer[self.write_slots] = v.to(v_layer.dtype)
        keys = k_layer[self.read_slots].to(q.dtype)
        values = v_layer[self.read_slots].to(q.dtype)
        return masked_attention(q, keys, values, self.mask)


def build_step(
    pool: TokenKVPool,
    slots: list[torch.Tensor],
    kv_lens: list[int],
    new_tokens: list[list[int]],
) -> tuple[torch.Tensor, torch.Tensor, PagedAttention]:
    """Token ids [B, S], positions [B, S] and the attention backend for one padded step."""
    batch = len(new_tokens)
    width = max(len(t) for t in new_tokens)
    read_lens = [kv + len(t) for kv, t in zip(kv_lens, new_tokens)]
    span = max(read_lens)
    ids = torch.tensor([t + [0] * (width - len(t)) for t in new_tokens], dtype=torch.long)
    offsets = torch.tensor(kv_lens, dtype=torch.long)
    positions = offsets[:, None] + torch.arange(width)[None, :]
    write = torch.zeros(batch, width, dtype=torch.long)
    read = torch.zeros(batch, span, dtype=torch.long)
    for b in range(batch):
        n = len(new_tokens[b])
        write[b, :n] = slots[b][kv_lens[b] : kv_lens[b] + n]
        read[b, : read_lens[b]] = slots[b][: read_lens[b]]
    key_pos = torch.arange(span)
    valid = key_pos[None, :] < torch.tensor(read_lens)[:, None]  # [B, L]
    mask = (key_pos[None, None, :] <= positions[:, :, None]) & valid[:, None, :]
    return ids, positions, PagedAttention(pool, write, read, mask[:, None])
