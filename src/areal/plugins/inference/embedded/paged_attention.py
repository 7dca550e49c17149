"""The engine's ``AttentionBackend``s: write new k/v into pool slots, attend over each sequence's.

Decode runs as a padded batch (one new token per row): attention in the C++ kernel, each row
reading its own slots in place (decode_kernel.py), or with ATen, keys gathered and padded per
bucket of similar rows. Prefill runs packed: every sequence's new tokens end to end in one row,
no padding, each sequence attending over its own keys. A prefill batch mixes a 14-token prompt
with a 300-token sequence re-prefilled after a weight update; padded, the short rows would cost
as much as the long one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from areal.plugins.inference.embedded import decode_kernel
from areal.plugins.inference.embedded.kv_pool import TokenKVPool
from areal.plugins.models.attention import QKNorms, causal_attention, masked_attention

MAX_BUCKETS = 4  # attention calls per layer in a padded step, at most


def _store(
    pool: TokenKVPool, layer_idx: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Write a step's new keys and values [.., H, D] into their ``slots``; the layer's pool.

    index_copy_ (and index_select to read) on the slot dimension: ~4x faster on CPU than
    assigning through an index tensor."""
    k_layer, v_layer = pool.k[layer_idx], pool.v[layer_idx]
    heads = k_layer.shape[1:]
    k_layer.index_copy_(0, slots, k.reshape(-1, *heads).to(k_layer.dtype))
    v_layer.index_copy_(0, slots, v.reshape(-1, *heads).to(v_layer.dtype))
    return k_layer, v_layer


@dataclass
class _Bucket:
    """Rows of a padded step whose keys are gathered and attended together, padded to the
    longest of them: ``read`` [rows × span] slots (flat), ``mask`` [rows, 1, S, span], ``lens``
    [rows] the slots each row reads."""

    rows: torch.Tensor
    span: int
    read: torch.Tensor
    mask: torch.Tensor
    lens: torch.Tensor
    keys: torch.Tensor | None = None  # the gather buffers, made by the first layer
    values: torch.Tensor | None = None


class PagedAttention:
    """One forward step over a batch of sequences that each own a list of KV slots.

    ``write_slots`` [B × S] are the slots of the step's new tokens (padding writes slot 0). Rows
    attend in buckets of similar length, each padded only to its own longest: one 300-token
    sequence among 31 of 30 tokens would otherwise make every row gather and attend over 300 keys
    (measured: a decode step of 32 rows took 5.5× as long). Masks are built once per step and
    shared by every layer.

    With ``kernel`` (a decode step, the C++ kernel loaded: decode_kernel.py) every row is in one
    bucket and the kernel writes and attends in one call a layer, each row reading only its own
    slots, so unequal rows cost nothing extra.
    """

    def __init__(
        self,
        pool: TokenKVPool,
        write_slots: torch.Tensor,
        buckets: list[_Bucket],
        kernel: bool = False,
    ) -> None:
        self.pool = pool
        self.write_slots = write_slots
        self.buckets = buckets
        self.kernel = kernel
        self.slots: decode_kernel.KernelSlots | None = None
        if kernel:
            (bucket,) = buckets
            read = bucket.read.view(-1, bucket.span)
            self.slots = decode_kernel.KernelSlots(pool.k, pool.v, write_slots, read, bucket.lens)

    @property
    def fuses_rope(self) -> bool:
        """The kernel applies the q/k norms and RoPE too (:meth:`attend_rope`)."""
        return self.slots is not None

    def attend_rope(
        self,
        layer_idx: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        norms: QKNorms,
    ) -> torch.Tensor:
        assert self.slots is not None
        return self.slots.attend_rope(layer_idx, q, k, v, cos, sin, norms)

    def attend(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        if self.slots is not None:
            return self.slots.attend(layer_idx, q, k, v)
        k_layer, v_layer = _store(self.pool, layer_idx, self.write_slots, k, v)
        if len(self.buckets) == 1:
            return self._attend(self.buckets[0], q, k_layer, v_layer)
        out = torch.empty_like(q)
        for bucket in self.buckets:
            out.index_copy_(
                0,
                bucket.rows,
                self._attend(bucket, q.index_select(0, bucket.rows), k_layer, v_layer),
            )
        return out

    @staticmethod
    def _attend(
        bucket: _Bucket, q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor
    ) -> torch.Tensor:
        if bucket.keys is None or bucket.values is None:
            # One gather buffer per step, reused by every layer: a fresh multi-MB tensor per
            # layer is fresh pages from the OS each time (measured: the gather ran 10x slower).
            bucket.keys = k_layer.new_empty((bucket.read.numel(), *k_layer.shape[1:]))
            bucket.values = v_layer.new_empty((bucket.read.numel(), *v_layer.shape[1:]))
        torch.index_select(k_layer, 0, bucket.read, out=bucket.keys)
        torch.index_select(v_layer, 0, bucket.read, out=bucket.values)
        shape = (q.shape[0], bucket.span, *k_layer.shape[1:])
        keys = bucket.keys.view(shape).to(q.dtype)
        values = bucket.values.view(shape).to(q.dtype)
        return masked_attention(q, keys, values, bucket.mask)


def _buckets(read_lens: list[int]) -> list[list[int]]:
    """Rows grouped longest first; a row joins the open group while at least half its longest.
    Past ``MAX_BUCKETS`` groups the rest share the last one. Each group lists its rows in order."""
    order = sorted(range(len(read_lens)), key=lambda b: -read_lens[b])
    groups: list[list[int]] = []
    for b in order:
        if groups and (2 * read_lens[b] >= read_lens[groups[-1][0]] or len(groups) == MAX_BUCKETS):
            groups[-1].append(b)
        else:
            groups.append([b])
    return [sorted(group) for group in groups]  # one group: every row, in the batch's order


def build_step(
    pool: TokenKVPool,
    slots: list[torch.Tensor],
    kv_lens: list[int],
    new_tokens: list[list[int]],
    kernel: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, PagedAttention]:
    """Token ids [B, S], positions [B, S] and the attention backend for one padded step;
    ``kernel``: a decode step (one new token a row) attends in the C++ kernel."""
    batch = len(new_tokens)
    width = max(len(t) for t in new_tokens)
    kernel = kernel and width == 1
    read_lens = [kv + len(t) for kv, t in zip(kv_lens, new_tokens)]
    ids = torch.tensor([t + [0] * (width - len(t)) for t in new_tokens], dtype=torch.long)
    offsets = torch.tensor(kv_lens, dtype=torch.long)
    positions = offsets[:, None] + torch.arange(width)[None, :]
    write = torch.zeros(batch, width, dtype=torch.long)
    for b in range(batch):
        n = len(new_tokens[b])
        write[b, :n] = slots[b][kv_lens[b] : kv_lens[b] + n]
    buckets = [
        _bucket(rows, [slots[b] for b in rows], [read_lens[b] for b in rows], positions[rows])
        for rows in ([list(range(batch))] if kernel else _buckets(read_lens))
    ]
    return ids, positions, PagedAttention(pool, write.view(-1), buckets, kernel)


def _bucket(
    rows: list[int], row_slots: list[torch.Tensor], read_lens: list[int], positions: torch.Tensor
) -> _Bucket:
    """The bucket of ``rows``: each reads its first ``read_lens`` slots, padded to the longest;
    a query at position p sees the keys at positions <= p."""
    span = max(read_lens)
    read = torch.zeros(len(rows), span, dtype=torch.long)
    for i, (seq_slots, n) in enumerate(zip(row_slots, read_lens)):
        read[i, :n] = seq_slots[:n]
    key_pos = torch.arange(span)
    lens = torch.tensor(read_lens)
    valid = key_pos[None, :] < lens[:, None]
    mask = (key_pos[None, None, :] <= positions[:, :, None]) & valid[:, None, :]
    return _Bucket(torch.tensor(rows), span, read.view(-1), mask[:, None], lens)


@dataclass
class _Run:
    """Sequences next to each other in the packed row, attended in one call: ``count`` fresh ones
    of ``length`` tokens each (causal over their own keys, as a [count, length] batch), or one
    sequence that continues a cache (its ``cached`` bucket: its slots, as a decode row reads)."""

    start: int
    count: int
    length: int
    cached: _Bucket | None = None


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
        k_layer, v_layer = _store(self.pool, layer_idx, self.write_slots, k, v)
        outs = []
        for run in self.runs:
            end = run.start + run.count * run.length
            if run.cached is not None:
                outs.append(
                    PagedAttention._attend(run.cached, q[:, run.start : end], k_layer, v_layer)
                )
                continue
            shape = (run.count, run.length, *q.shape[2:])
            kv_shape = (run.count, run.length, *k.shape[2:])
            out = causal_attention(
                q[0, run.start : end].view(shape),
                k[0, run.start : end].view(kv_shape),
                v[0, run.start : end].view(kv_shape),
            )
            outs.append(out.reshape(1, end - run.start, *q.shape[2:]))
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
            cached = _bucket([0], [seq_slots], [kv + n], positions[-1][None])
            runs.append(_Run(start, 1, n, cached))
        elif runs and runs[-1].cached is None and runs[-1].length == n:
            runs[-1].count += 1
        else:
            runs.append(_Run(start, 1, n))
        start += n
    ids = torch.tensor([[t for tokens in new_tokens for t in tokens]], dtype=torch.long)
    backend = PackedPrefill(pool, torch.cat(writes), runs)
    return ids, torch.cat(positions)[None], backend, spans
