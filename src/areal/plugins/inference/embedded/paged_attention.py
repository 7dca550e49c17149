"""The engine's ``AttentionBackend``s: write new k/v into pool slots, attend over each sequence's.

Decode runs as a padded batch (one new token per row, keys padded to the longest row). Prefill
runs packed: every sequence's new tokens end to end in one row, no padding, each sequence
attending over its own keys. A prefill batch mixes a 14-token prompt with a 300-token sequence
re-prefilled after a weight update; padded, the short rows would cost as much as the long one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from areal.plugins.inference.embedded.kv_pool import TokenKVPool
from areal.plugins.models.attention import causal_attention, masked_attention


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


@dataclass
class _Run:
    """Sequences next to each other in the packed row, attended in one call: ``count`` fresh ones
    of ``length`` tokens each (causal over their own keys, as a [count, length] batch), or one
    sequence that continues a cache (``read`` its slots, under an offset causal ``mask``)."""

    start: int
    count: int
    length: int
    read: torch.Tensor | None = None
    mask: torch.Tensor | None = None


class PackedPrefill:
    """One forward step over sequences packed end to end in a single row ``[1, T]``.

    Fresh sequences need no gather from the pool: they attend over the keys just computed, and a
    run of equal-length ones (a GRPO group's shared prompt) is one batched call.
    """

    def __init__(self, pool: TokenKVPool, write_slots: torch.Tensor, runs: list[_Run]) -> None:
        self.pool = pool
        self.write_slots = write_slots
        self.runs = runs

    def attend(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        k_layer, v_layer = self.pool.k[layer_idx], self.pool.v[layer_idx]
        k_layer[self.write_slots] = k[0].to(k_layer.dtype)
        v_layer[self.write_slots] = v[0].to(v_layer.dtype)
        outs = []
        for run in self.runs:
            end = run.start + run.count * run.length
            if run.read is None or run.mask is None:
                shape = (run.count, run.length, *q.shape[2:])
                kv_shape = (run.count, run.length, *k.shape[2:])
                out = causal_attention(
                    q[0, run.start : end].view(shape),
                    k[0, run.start : end].view(kv_shape),
                    v[0, run.start : end].view(kv_shape),
                )
                outs.append(out.reshape(1, end - run.start, *q.shape[2:]))
                continue
            keys = k_layer[run.read].to(q.dtype)[None]
            values = v_layer[run.read].to(q.dtype)[None]
            outs.append(masked_attention(q[:, run.start : end], keys, values, run.mask))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


def build_packed_step(
    pool: TokenKVPool,
    slots: list[torch.Tensor],
    kv_lens: list[int],
    new_tokens: list[list[int]],
) -> tuple[torch.Tensor, torch.Tensor, PackedPrefill, list[tuple[int, int]]]:
    """Token ids [1, T], positions [1, T], the backend and each sequence's span in the row."""
    spans: list[tuple[int, int]] = []
    positions: list[torch.Tensor] = []
    writes: list[torch.Tensor] = []
    runs: list[_Run] = []
    start = 0
    for seq_slots, kv, tokens in zip(slots, kv_lens, new_tokens):
        n = len(tokens)
        spans.append((start, start + n))
        positions.append(torch.arange(kv, kv + n))
        writes.append(seq_slots[kv : kv + n])
        if kv > 0:
            causal = torch.arange(kv + n)[None, :] <= torch.arange(kv, kv + n)[:, None]
            runs.append(_Run(start, 1, n, seq_slots[: kv + n], causal[None, None]))
        elif runs and runs[-1].read is None and runs[-1].length == n:
            runs[-1].count += 1
        else:
            runs.append(_Run(start, 1, n))
        start += n
    ids = torch.tensor([[t for tokens in new_tokens for t in tokens]], dtype=torch.long)
    backend = PackedPrefill(pool, torch.cat(writes), runs)
    return ids, torch.cat(positions)[None], backend, spans
