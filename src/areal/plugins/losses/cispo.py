"""CISPO, clipped importance-sampling policy optimisation (MiniMax-M1, MiniMax 2025).

PPO's clip zeroes the gradient of a token whose ratio left the trust region, and the rare tokens
that matter most for long reasoning (the "however", "wait") are often those. CISPO clips the
importance-sampling *weight* instead and keeps every token's gradient, REINFORCE-style::

    loss_t = −sg(clip(r_t, 1 − ε_low, 1 + ε_high)) · w_t · A_t · log π_θ(y_t)

with r = π_θ / π_prox and sg the stop-gradient, so d loss_t / d log π_θ = −clip(r)·w·A. As in
MiniMax-M1 the lower bound is off by default (``eps_clip_low: None``): only the upper one is
tuned. w is the behaviour weight of the decoupled loss with its bounding rule
(:mod:`.behavior_weight`). The loss's *value* (−Σ clip(r)·w·A·log π / n) is not an objective to
read: only its gradient is meaningful.
"""

from __future__ import annotations

import torch
from torch import Tensor

from areal.plugins.losses.behavior_weight import behavior_weight
from areal.plugins.losses.stats import common_stats, stats_to_floats
from areal.plugins.losses.tokens import aggregate, check_shapes, masked

__all__ = ["cispo_loss"]


def cispo_loss(
    *,
    logprobs: Tensor,
    proximal_logprobs: Tensor,
    behavior_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    cu_seqlens: Tensor | None = None,
    eps_clip_low: float | None = None,
    eps_clip_high: float | None = 0.2,
    behavior_weight_cap: float | None = None,
    behavior_weight_floor: float | None = None,
    behavior_weight_action: str = "mask",
    behavior_weight_level: str = "token",
    behavior_weight_metric: str = "ratio",
    behavior_weight_agg: str = "mean",
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The CISPO loss of the module docstring and its statistics: the common ones
    (:func:`~.stats.common_stats`) and ``clip_fraction`` (valid tokens whose weight was
    clipped). ``None`` for a bound leaves that side unclipped."""
    check_shapes(
        logprobs=logprobs,
        proximal_logprobs=proximal_logprobs,
        behavior_logprobs=behavior_logprobs,
        advantages=advantages,
        loss_mask=loss_mask,
    )
    for name, eps in (("eps_clip_low", eps_clip_low), ("eps_clip_high", eps_clip_high)):
        if eps is not None and not eps > 0:
            raise ValueError(f"{name} must be > 0 (or null: unclipped); got {eps}")
    mask = loss_mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    logp = masked(mask, logprobs, detach=False)
    prox = masked(mask, proximal_logprobs)
    adv = masked(mask, advantages)

    log_r = logp.detach() - prox
    ratio = torch.exp(log_r)
    low = 1.0 - eps_clip_low if eps_clip_low is not None else None
    high = 1.0 + eps_clip_high if eps_clip_high is not None else None
    weight_is = ratio if low is None and high is None else ratio.clamp(low, high)
    clipped = mask & (weight_is != ratio)

    rule = behavior_weight(
        log_ratio=prox - masked(mask, behavior_logprobs),
        mask=mask,
        cu_seqlens=cu_seqlens,
        cap=behavior_weight_cap,
        floor=behavior_weight_floor,
        action=behavior_weight_action,
        level=behavior_weight_level,
        metric=behavior_weight_metric,
        agg=behavior_weight_agg,
    )
    per_token = torch.where(rule.kept, -(weight_is * rule.weight * adv) * logp, zero)
    denom = mask.sum().clamp(min=1).to(logprobs.dtype)
    loss = aggregate(
        per_token, mask, mode=loss_agg_mode, cu_seqlens=cu_seqlens, scale_factor=loss_scale_factor
    )

    stats = {"clip_fraction": clipped.sum() / denom}
    stats.update(common_stats(ratio=ratio, log_ratio=log_r, mask=mask, rule=rule))
    return loss, stats_to_floats(stats)
