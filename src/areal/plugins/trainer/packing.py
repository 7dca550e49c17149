"""Sequence packing: many samples in one row of tokens, no padding.

Padding a batch of long-tailed sequences to the longest one wastes most of the compute on a CPU
(and a good part on a GPU). Packing concatenates the samples into a single ``[1, N]`` row; the
positions restart at 0 for each sample (so RoPE sees what it would see for the sample alone) and
:class:`~areal.plugins.trainer.packed_attention.PackedCausalAttention` keeps attention inside each
sample.

Alignment: the model's output at position ``t`` predicts the token at ``t + 1``, so every per-token
tensor of a :class:`PackedBatch` is indexed by the *predicting* position: ``target_ids[t]`` is the
next token of the same sample, and ``loss_mask[t]``, ``behavior_logprobs[t]``, ``versions[t]`` and
``temperatures[t]`` are those of that next token. The last position of each sample predicts nothing (mask 0, target 0,
version -1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from areal.core.types import Sample

__all__ = ["PackedBatch", "pack", "pack_one"]


@dataclass
class PackedBatch:
    """Samples concatenated into one row; per-token tensors are ``[N]``, aligned to predictions."""

    input_ids: Tensor  # [1, N] int64
    positions: Tensor  # [1, N] int64, restarting at 0 per sample
    cu_seqlens: Tensor  # [n_samples + 1] int64: sample i is tokens cu[i]:cu[i+1]
    target_ids: Tensor  # [N] int64: the next token of the same sample (0 at a sample's end)
    loss_mask: Tensor  # [N] bool: the next token is a generated one to train on
    behavior_logprobs: Tensor  # [N] float32: the engine's log-prob of the next token
    versions: Tensor  # [N] int64: the policy version that generated the next token (-1: none)
    sample_index: Tensor  # [N] int64: index of the token's sample in the list given to pack()
    temperatures: Tensor  # [N] float32: the temperature the next token was sampled at (1: none)

    @property
    def n_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def n_samples(self) -> int:
        return int(self.cu_seqlens.shape[0]) - 1

    def to(self, device: torch.device | str) -> PackedBatch:
        return PackedBatch(**{k: v.to(device) for k, v in vars(self).items()})


def pack(samples: list[Sample], max_tokens: int | None = None) -> list[PackedBatch]:
    """Pack ``samples`` into as few rows as possible, each at most ``max_tokens`` tokens.

    Samples are taken **in order** (not first-fit decreasing): a new pack starts when the next
    sample would not fit, so a minibatch's samples stay together and in their order. A sample longer
    than ``max_tokens`` gets a pack of its own rather than being cut. ``sample_index`` always refers
    to positions in ``samples``. Empty samples are rejected: they predict nothing and would break
    the ``cu_seqlens`` invariant that every sample has a token.
    """
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1; got {max_tokens}")
    groups: list[list[int]] = []
    used = 0
    for i, sample in enumerate(samples):
        n = len(sample.input_ids)
        if n == 0:
            raise ValueError(f"sample {i} has no tokens")
        if not groups or (max_tokens is not None and used + n > max_tokens):
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += n
    return [pack_one([samples[i] for i in g], sample_indices=g) for g in groups]


def pack_one(samples: list[Sample], sample_indices: list[int] | None = None) -> PackedBatch:
    """All ``samples`` in one row; ``sample_indices`` name them (default ``0..len-1``)."""
    if not samples:
        raise ValueError("cannot pack zero samples")
    indices = sample_indices if sample_indices is not None else list(range(len(samples)))
    if len(indices) != len(samples):
        raise ValueError(f"{len(indices)} sample indices for {len(samples)} samples")
    lengths = np.array([len(s.input_ids) for s in samples], dtype=np.int64)
    cu = np.concatenate([[0], np.cumsum(lengths)])
    ends = cu[1:] - 1  # each sample's last position: it predicts nothing

    def joined(name: str, dtype: type) -> np.ndarray:
        return np.concatenate([getattr(s, name) for s in samples]).astype(dtype)

    def next_token(values: np.ndarray, pad: float) -> Tensor:
        """Shift by one: position t holds the value of token t+1 of the same sample."""
        shifted = np.empty_like(values)
        shifted[:-1] = values[1:]
        shifted[ends] = pad
        return torch.from_numpy(shifted)

    ids = joined("input_ids", np.int64)

    def per_token(values: list[float] | list[int], dtype: type) -> Tensor:
        return torch.from_numpy(np.repeat(np.asarray(values, dtype=dtype), lengths))

    return PackedBatch(
        input_ids=torch.from_numpy(ids).unsqueeze(0),
        positions=torch.from_numpy(np.arange(len(ids)) - np.repeat(cu[:-1], lengths)).unsqueeze(0),
        cu_seqlens=torch.from_numpy(cu),
        target_ids=next_token(ids, 0),
        loss_mask=next_token(joined("loss_mask", np.bool_), 0),
        behavior_logprobs=next_token(joined("logprobs", np.float32), 0.0),
        versions=next_token(joined("versions", np.int64), -1),
        sample_index=per_token(indices, np.int64),
        temperatures=per_token([s.temperature for s in samples], np.float32),
    )
