"""The trust-region ratio r = π_θ / π_prox, per token or per sequence (GSPO).

``importance_sampling_level: sequence`` is GSPO (Zheng et al. 2025): a sequence's ratio is the
geometric mean of its tokens' ratios, s = exp(mean over its valid tokens of log π_θ − log π_prox),
so one long answer is clipped as a whole rather than token by token. The gradient is that of
GSPO's token form, s_t = sg(s) · π_θ(y_t) / sg(π_θ(y_t)): each token's value is s, its gradient
s · ∇log π_θ(y_t), so per-token advantages still reach their own tokens (verl's ``gspo``).

``sequence_mean_adv`` is GSPO as AReaL 1.0.4 computes it: each token's advantage is replaced by
its sequence's mean advantage, and the ratio s is differentiated as a whole, so every token of a
sequence gets the gradient (s / n) · ∇ Σ log π_θ. Without a behaviour weight the two levels give
the same gradient wherever a sequence has one advantage (GRPO, RLOO); per-token advantages (GAE)
or per-token behaviour weights tell them apart (``sequence`` weighs each token's gradient by its
own weight, ``sequence_mean_adv`` by the sequence's mean weight).
"""

from __future__ import annotations

import torch
from torch import Tensor

from areal.plugins.losses.tokens import Sequences, check_choice

__all__ = ["IS_LEVELS", "log_ratio", "sequence_advantages"]

IS_LEVELS = ("token", "sequence", "sequence_mean_adv")


def log_ratio(
    *,
    logp: Tensor,
    prox: Tensor,
    mask: Tensor,
    level: str = "token",
    cu_seqlens: Tensor | None = None,
) -> Tensor:
    """log r per position; ``logp`` and ``prox`` already hold 0 where ``mask`` is 0. A sequence's
    ratio is the mean over the positions of ``mask`` only (the loss passes the tokens its
    behaviour-weight rule kept, as AReaL does)."""
    check_choice("importance_sampling_level", level, IS_LEVELS)
    token = logp - prox
    if level == "token":
        return token
    sequences = Sequences.of(mask, cu_seqlens)
    kept = torch.where(mask, token, torch.zeros((), dtype=token.dtype, device=token.device))
    if level == "sequence_mean_adv":
        return sequences.mean(kept, mask)
    return sequences.mean(kept.detach(), mask) + (logp - logp.detach())


def sequence_advantages(
    *, adv: Tensor, mask: Tensor, level: str, cu_seqlens: Tensor | None = None
) -> Tensor:
    """``adv`` as the ratio's ``level`` uses it: each sequence's mean over its valid tokens for
    ``sequence_mean_adv`` (0 elsewhere), unchanged otherwise."""
    if level != "sequence_mean_adv":
        return adv
    zero = torch.zeros((), dtype=adv.dtype, device=adv.device)
    mean = Sequences.of(mask, cu_seqlens).mean(torch.where(mask, adv, zero), mask)
    return torch.where(mask, mean, zero)
