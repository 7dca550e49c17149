"""SAPO, Soft Adaptive Policy Optimization (Gao et al. 2025, Qwen, arXiv:2511.20347).

Instead of PPO's hard clip, SAPO passes the ratio r = π_θ / π_prox through a smooth sigmoid gate
whose temperature depends on the advantage's sign, so tokens drifting off-policy lose gradient
gradually rather than all at once::

    τ_t    = τ_pos if A_t > 0 else τ_neg
    f(r)   = σ(τ_t · (r − 1)) · 4 / τ_t
    loss_t = −w_t · f(r_t) · A_t

At r = 1 the gradient is exactly the policy gradient's (d f / d r = τ·σ(1−σ)·4/τ = 1) and it
decays like σ(1−σ) away from it; the paper sets τ_neg > τ_pos (1.05 vs 1.0) because negative
updates spread probability mass over many unsampled tokens and destabilise sooner. w is the
behaviour weight π_prox / π_behav of the decoupled loss, with the same bounding rule
(:mod:`.behavior_weight`); the loss is averaged over valid tokens like every built-in.
"""

from __future__ import annotations

import torch
from torch import Tensor

from areal.plugins.losses.behavior_weight import behavior_weight
from areal.plugins.losses.ratio import log_ratio, sequence_advantages
from areal.plugins.losses.stats import common_stats, stats_to_floats
from areal.plugins.losses.tokens import aggregate, check_shapes, masked

__all__ = ["sapo_loss"]


def sapo_loss(
    *,
    logprobs: Tensor,
    proximal_logprobs: Tensor,
    behavior_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    cu_seqlens: Tensor | None = None,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    importance_sampling_level: str = "token",
    behavior_weight_cap: float | None = None,
    behavior_weight_floor: float | None = None,
    behavior_weight_action: str = "mask",
    behavior_weight_level: str = "token",
    behavior_weight_metric: str = "ratio",
    behavior_weight_agg: str = "mean",
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The SAPO loss of the module docstring and its statistics: the common ones
    (:func:`~.stats.common_stats`) and ``gate_mean``, the mean over valid tokens of
    ``4·σ(1−σ)`` (the gradient's scale against the plain policy gradient: 1 on-policy)."""
    check_shapes(
        logprobs=logprobs,
        proximal_logprobs=proximal_logprobs,
        behavior_logprobs=behavior_logprobs,
        advantages=advantages,
        loss_mask=loss_mask,
    )
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"tau_pos and tau_neg must be > 0; got {tau_pos}, {tau_neg}")
    mask = loss_mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    logp = masked(mask, logprobs, detach=False)
    prox = masked(mask, proximal_logprobs)
    adv = masked(mask, advantages)

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
    log_r = log_ratio(
        logp=logp, prox=prox, mask=rule.kept, level=importance_sampling_level, cu_seqlens=cu_seqlens
    )
    adv = sequence_advantages(
        adv=adv, mask=rule.kept, level=importance_sampling_level, cu_seqlens=cu_seqlens
    )
    ratio = torch.exp(torch.where(mask, log_r, zero))
    tau = torch.where(adv > 0, tau_pos, tau_neg).to(logprobs.dtype)
    sigma = torch.sigmoid(tau * (ratio - 1.0))
    per_token = -(sigma * 4.0 / tau) * adv

    per_token = torch.where(rule.kept, per_token * rule.weight, zero)
    denom = mask.sum().clamp(min=1).to(logprobs.dtype)
    loss = aggregate(
        per_token, mask, mode=loss_agg_mode, cu_seqlens=cu_seqlens, scale_factor=loss_scale_factor
    )

    stats = common_stats(ratio=ratio, log_ratio=log_r, mask=mask, rule=rule)
    gate = torch.where(mask, 4.0 * sigma.detach() * (1.0 - sigma.detach()), zero)
    stats["gate_mean"] = gate.sum() / denom
    return loss, stats_to_floats(stats)
