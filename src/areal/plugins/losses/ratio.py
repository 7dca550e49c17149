"""The trust-region ratio r = π_θ / π_prox, per token or per sequence (GSPO).

``importance_sampling_level: sequence`` is GSPO (Zheng et al. 2025): a sequence's ratio is the
geometric mean of its tokens' ratios, s = exp(mean over its valid tokens of log π_θ − log π_prox),
so one long answer is clipped as a whole rather than token by token. The gradient is that of
GSPO's token form, s_t = sg(s) · π_θ(y_t) / sg(π_θ(y_t)): each token's value is s, its gradient
s · ∇log π_θ(y_t), so per-token advantages still reach their own tokens.
"""

from __future__ import annotations

from torch import Tensor

from areal.plugins.losses.tokens import Sequences, check_choice

__all__ = ["IS_LEVELS", "log_ratio"]

IS_LEVELS = ("token", "sequence")


def log_ratio(
    *,
    logp: Tensor,
    prox: Tensor,
    mask: Tensor,
    level: str = "token",
    cu_seqlens: Tensor | None = None,
) -> Tensor:
    """log r per position; ``logp`` and ``prox`` already hold 0 where ``mask`` is 0."""
    check_choice("importance_sampling_level", level, IS_LEVELS)
    token = logp - prox
    if level == "token":
        return token
    sequence = Sequences.of(mask, cu_seqlens).mean(token.detach(), mask)
    return sequence + (logp - logp.detach())
