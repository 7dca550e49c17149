"""Helpers every loss shares: shape checks, option checks, masked inputs, sequences.

A loss sees one shape for all its tensors: packed ``[N]`` (the trainer) with ``cu_seqlens``
saying where each sequence starts, or padded ``[B, T]`` where each row is a sequence and
``cu_seqlens`` is ``None``. :class:`Sequences` turns either into a sequence index per position,
which is all a sequence-level loss (GSPO, sequence-level behaviour weights) needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["AGG_MODES", "Sequences", "aggregate", "check_choice", "check_shapes", "masked"]

# How a loss turns its per-token terms into one number (verl's ``loss_agg_mode`` names).
AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def check_shapes(**tensors: Tensor) -> None:
    """All inputs share one shape; the error lists each input's."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name}={shape}" for name, shape in shapes.items())
        raise ValueError(f"all inputs must share one shape; got {listed}")


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    """An option that names one of a few modes, rejected with the modes it could have been."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def masked(mask: Tensor, tensor: Tensor, *, detach: bool = True) -> Tensor:
    """``tensor`` with zeros where ``mask`` is 0, *before* any arithmetic: masked positions may
    hold -inf or NaN, and ``-inf − -inf`` would poison the gradient even when multiplied by 0."""
    source = tensor.detach() if detach else tensor
    return torch.where(mask, source, torch.zeros((), dtype=source.dtype, device=source.device))


@dataclass(frozen=True)
class Sequences:
    """Which sequence each position belongs to (``index``, the inputs' shape) and how many."""

    index: Tensor
    count: int

    @classmethod
    def of(cls, loss_mask: Tensor, cu_seqlens: Tensor | None) -> Sequences:
        """From packed ``[N]`` inputs with their ``cu_seqlens``, or from ``[B, T]`` rows."""
        if loss_mask.dim() == 2 and cu_seqlens is None:
            b, t = loss_mask.shape
            rows = torch.arange(b, device=loss_mask.device)
            return cls(rows[:, None].expand(b, t), b)
        if loss_mask.dim() == 1 and cu_seqlens is not None:
            cu = cu_seqlens.to(device=loss_mask.device, dtype=torch.long)
            if cu.dim() != 1 or int(cu[0]) != 0 or int(cu[-1]) != loss_mask.shape[0]:
                raise ValueError(
                    f"cu_seqlens must run from 0 to the {loss_mask.shape[0]} packed positions; "
                    f"got {cu.tolist()}"
                )
            count = cu.shape[0] - 1
            ids = torch.arange(count, device=cu.device)
            return cls(torch.repeat_interleave(ids, cu[1:] - cu[:-1]), count)
        raise ValueError(
            "a sequence-level option needs the sequences: packed [N] inputs with cu_seqlens, "
            f"or [B, T] rows with cu_seqlens=None; got shape {tuple(loss_mask.shape)} and "
            f"cu_seqlens={'None' if cu_seqlens is None else 'given'}"
        )

    def mean(self, values: Tensor, mask: Tensor) -> Tensor:
        """Each position gets the mean of ``values`` over the valid positions of its sequence (0
        for a sequence without any); differentiable. ``values`` must be 0 where ``mask`` is."""
        flat_index = self.index.reshape(-1)
        zeros = torch.zeros(self.count, dtype=values.dtype, device=values.device)
        sums = zeros.index_add(0, flat_index, values.reshape(-1))
        counts = zeros.detach().index_add(0, flat_index, mask.reshape(-1).to(values.dtype))
        return (sums / counts.clamp(min=1))[self.index]


def aggregate(
    per_token: Tensor,
    mask: Tensor,
    *,
    mode: str = "token-mean",
    cu_seqlens: Tensor | None = None,
    scale_factor: float | None = None,
) -> Tensor:
    """One loss from per-token terms (0 where ``mask`` is 0), by ``loss_agg_mode``:

    - ``token-mean``: Σ / valid tokens, so every token weighs alike (AReaL, DAPO; the default);
    - ``seq-mean-token-mean``: each sequence's token mean, then the mean over the sequences that
      have a valid token (GRPO's original form: a long answer weighs as much as a short one);
    - ``seq-mean-token-sum``: each sequence's token sum, then the mean over those sequences;
    - ``seq-mean-token-sum-norm``: that, divided by a constant ``scale_factor`` (Dr. GRPO, Liu et
      al. 2025: no length bias in either direction). For ``[B, T]`` rows it defaults to T, as in
      verl; packed ``[N]`` inputs have no row width, so they need it given (e.g. the run's
      ``sampling.max_new_tokens``).
    """
    check_choice("loss_agg_mode", mode, AGG_MODES)
    n_valid = mask.sum().clamp(min=1).to(per_token.dtype)
    if mode == "token-mean":
        return per_token.sum() / n_valid
    if mode == "seq-mean-token-sum-norm" and scale_factor is None:
        if mask.dim() != 2 or cu_seqlens is not None:
            raise ValueError(
                "loss_agg_mode seq-mean-token-sum-norm divides by a constant length, and packed "
                "inputs have none: set loss_scale_factor (e.g. sampling.max_new_tokens)"
            )
        scale_factor = float(mask.shape[-1])
    if scale_factor is not None and not scale_factor > 0:
        raise ValueError(f"loss_scale_factor must be > 0; got {scale_factor}")
    sequences = Sequences.of(mask, cu_seqlens)
    flat_index = sequences.index.reshape(-1)
    zeros = torch.zeros(sequences.count, dtype=per_token.dtype, device=per_token.device)
    sums = zeros.index_add(0, flat_index, per_token.reshape(-1))
    counts = zeros.detach().index_add(0, flat_index, mask.reshape(-1).to(per_token.dtype))
    has_tokens = counts > 0
    n_seqs = has_tokens.sum().clamp(min=1).to(per_token.dtype)
    if mode == "seq-mean-token-mean":
        sums = sums / counts.clamp(min=1)
    loss = torch.where(has_tokens, sums, zeros.detach()).sum() / n_seqs
    if mode == "seq-mean-token-sum-norm":
        assert scale_factor is not None  # set from the row width above when not given
        loss = loss / scale_factor
    return loss
