"""Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for
Reasoning Language Models"; verl's ``clip_cov`` and ``kl_cov`` policy losses).

Policy entropy collapses because the tokens whose log-probability and advantage covary most push
the policy towards certainty. Both losses find those tokens by the per-token covariance
``cov_t = (A_t − mean A) · (log π_θ(y_t) − mean log π_θ)`` (means over the batch's valid tokens)
and restrain only them, leaving PPO's clipped loss everywhere else:

- ``clip_cov``: among the tokens PPO's clip did not already bind whose ``cov`` lies in
  ``(clip_cov_lb, clip_cov_ub)``, a random ``clip_cov_ratio`` share (at least one) is detached:
  their loss term keeps its value times 0, so they get no gradient;
- ``kl_cov``: the ``kl_cov_ratio`` share (at least one) of valid tokens with the largest ``cov``
  get the unclipped term plus ``ppo_kl_coef · |log r|``; every other token the unclipped term
  ``−r·A`` (KL-Cov has no clip).

r = π_θ / π_prox; w (the behaviour weight and its rule, :mod:`.behavior_weight`) multiplies every
term, as verl's rollout importance weights do. Defaults are verl 0.9.1's. ``clip_cov`` draws its
random subset from torch's global generator, as verl does (``torch.randperm``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from areal.plugins.losses.behavior_weight import behavior_weight
from areal.plugins.losses.stats import common_stats, stats_to_floats
from areal.plugins.losses.tokens import aggregate, check_shapes, masked

__all__ = ["clip_cov_loss", "kl_cov_loss"]


def _covariance(adv: Tensor, logp: Tensor, mask: Tensor) -> Tensor:
    """``cov_t`` of the module docstring, 0 where ``mask`` is 0 (no gradient)."""
    n = mask.sum().clamp(min=1).to(adv.dtype)
    zero = torch.zeros((), dtype=adv.dtype, device=adv.device)
    a = torch.where(mask, adv, zero)
    lp = torch.where(mask, logp.detach(), zero)
    return torch.where(mask, (a - a.sum() / n) * (lp - lp.sum() / n), zero)


def clip_cov_loss(
    *,
    logprobs: Tensor,
    proximal_logprobs: Tensor,
    behavior_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    cu_seqlens: Tensor | None = None,
    eps_clip: float = 0.2,
    eps_clip_high: float | None = None,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
    behavior_weight_cap: float | None = None,
    behavior_weight_floor: float | None = None,
    behavior_weight_action: str = "mask",
    behavior_weight_level: str = "token",
    behavior_weight_metric: str = "ratio",
    behavior_weight_agg: str = "mean",
) -> tuple[Tensor, dict[str, float]]:
    """Clip-Cov of the module docstring; statistics: the common ones and ``clip_fraction`` (valid
    tokens the covariance rule detached)."""
    check_shapes(
        logprobs=logprobs,
        proximal_logprobs=proximal_logprobs,
        behavior_logprobs=behavior_logprobs,
        advantages=advantages,
        loss_mask=loss_mask,
    )
    if not eps_clip > 0 or (eps_clip_high is not None and not eps_clip_high > 0):
        raise ValueError(f"eps_clip and eps_clip_high must be > 0; got {eps_clip}, {eps_clip_high}")
    if not clip_cov_ratio > 0:
        raise ValueError(f"clip_cov_ratio must be > 0; got {clip_cov_ratio}")
    eps_high = eps_clip if eps_clip_high is None else eps_clip_high
    mask = loss_mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    logp = masked(mask, logprobs, detach=False)
    prox = masked(mask, proximal_logprobs)
    adv = masked(mask, advantages)

    log_r = logp - prox
    ratio = torch.exp(log_r)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - eps_clip, 1.0 + eps_high)
    clipped = mask & (loss_clipped > loss_unclipped)

    cov = _covariance(adv, logp, mask)
    candidates = mask & ~clipped & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    index = torch.nonzero(candidates.reshape(-1)).squeeze(-1)
    n_detach = max(int(clip_cov_ratio * int(mask.sum())), 1)
    chosen = index[torch.randperm(index.numel())[:n_detach].to(index.device)]
    detached = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
    detached[chosen] = True
    detached = detached.reshape(mask.shape)

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
    per_token = torch.maximum(loss_unclipped, loss_clipped)
    per_token = torch.where(detached, per_token * 0.0, per_token)
    per_token = torch.where(rule.kept, per_token * rule.weight, zero)
    loss = aggregate(
        per_token, mask, mode=loss_agg_mode, cu_seqlens=cu_seqlens, scale_factor=loss_scale_factor
    )

    denom = mask.sum().clamp(min=1).to(logprobs.dtype)
    stats = {"clip_fraction": detached.sum() / denom}
    stats.update(common_stats(ratio=ratio, log_ratio=log_r, mask=mask, rule=rule))
    return loss, stats_to_floats(stats)


def kl_cov_loss(
    *,
    logprobs: Tensor,
    proximal_logprobs: Tensor,
    behavior_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    cu_seqlens: Tensor | None = None,
    kl_cov_ratio: float = 0.0002,
    ppo_kl_coef: float = 0.1,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
    behavior_weight_cap: float | None = None,
    behavior_weight_floor: float | None = None,
    behavior_weight_action: str = "mask",
    behavior_weight_level: str = "token",
    behavior_weight_metric: str = "ratio",
    behavior_weight_agg: str = "mean",
) -> tuple[Tensor, dict[str, float]]:
    """KL-Cov of the module docstring; statistics: the common ones and ``kl_cov_fraction``
    (valid tokens that got the KL penalty)."""
    check_shapes(
        logprobs=logprobs,
        proximal_logprobs=proximal_logprobs,
        behavior_logprobs=behavior_logprobs,
        advantages=advantages,
        loss_mask=loss_mask,
    )
    if not kl_cov_ratio > 0:
        raise ValueError(f"kl_cov_ratio must be > 0; got {kl_cov_ratio}")
    mask = loss_mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    logp = masked(mask, logprobs, detach=False)
    prox = masked(mask, proximal_logprobs)
    adv = masked(mask, advantages)

    log_r = logp - prox
    ratio = torch.exp(log_r)
    per_token = -adv * ratio
    n_valid = int(mask.sum())
    penalised = torch.zeros_like(mask)
    if n_valid:
        index = torch.nonzero(mask.reshape(-1)).squeeze(-1)
        cov = _covariance(adv, logp, mask).reshape(-1)[index]
        top = torch.topk(cov, max(1, int(n_valid * kl_cov_ratio)), largest=True).indices
        flat = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
        flat[index[top]] = True
        penalised = flat.reshape(mask.shape)
        per_token = torch.where(penalised, per_token + ppo_kl_coef * log_r.abs(), per_token)

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
    per_token = torch.where(rule.kept, per_token * rule.weight, zero)
    loss = aggregate(
        per_token, mask, mode=loss_agg_mode, cu_seqlens=cu_seqlens, scale_factor=loss_scale_factor
    )

    denom = mask.sum().clamp(min=1).to(logprobs.dtype)
    stats = {"kl_cov_fraction": penalised.sum() / denom}
    stats.update(common_stats(ratio=ratio, log_ratio=log_r, mask=mask, rule=rule))
    return loss, stats_to_floats(stats)
