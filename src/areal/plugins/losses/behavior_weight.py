"""The behaviour importance weight w = π_prox / π_behav and the rule that bounds it.

Decoupled losses correct for stale samples with w, a constant of the step. A few very stale
tokens can have a huge w, so a rule bounds it, as AReaL does:

- **metric** the bound is checked on, per token, with ρ = log π_prox − log π_behav: ``ratio``
  (w = e^ρ itself), or an estimator of KL(π_behav ‖ π_prox) from tokens sampled by π_behav
  (Schulman 2020): ``k1`` = −ρ, ``k2`` = ρ²/2, ``k3`` = e^ρ − 1 − ρ;
- **level**: ``token`` checks every token; ``sequence`` checks each sequence once, on the
  geometric mean of its tokens' weights (``ratio``) or the mean of their KL estimates, and every
  token of the sequence then carries that geometric mean as its weight;
- **action** on a metric above ``cap`` or below ``floor``: ``mask`` drops the token (or the whole
  sequence) from the loss (it still counts in the denominator), ``clamp`` keeps it with its weight
  clamped into ``[floor, cap]`` (``ratio`` only: a KL bound is not a weight).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from areal.plugins.losses.tokens import Sequences, check_choice

__all__ = ["ACTIONS", "LEVELS", "METRICS", "BehaviorWeight", "behavior_weight"]

ACTIONS = ("mask", "clamp")
LEVELS = ("token", "sequence")
METRICS = ("ratio", "k1", "k2", "k3")


@dataclass(frozen=True)
class BehaviorWeight:
    """``weight``: w per position (0 where not ``kept``); ``kept``: valid positions left in the
    loss; ``bounded``: valid positions whose metric was out of bounds (masked or clamped)."""

    weight: Tensor
    kept: Tensor
    bounded: Tensor


def behavior_weight(
    *,
    log_ratio: Tensor,
    mask: Tensor,
    cu_seqlens: Tensor | None = None,
    cap: float | None = None,
    floor: float | None = None,
    action: str = "mask",
    level: str = "token",
    metric: str = "ratio",
) -> BehaviorWeight:
    """Bound ``log_ratio`` = log π_prox − log π_behav (0 where ``mask`` is 0) by the module's rule.

    With neither ``cap`` nor ``floor`` every valid token keeps its own weight (at ``level:
    token``). Option names in errors are the losses' (``behavior_weight_*``).
    """
    check_choice("behavior_weight_action", action, ACTIONS)
    check_choice("behavior_weight_level", level, LEVELS)
    check_choice("behavior_weight_metric", metric, METRICS)
    if action == "clamp" and metric != "ratio":
        raise ValueError(
            "behavior_weight_action clamp bounds the weight itself, so it needs "
            f"behavior_weight_metric ratio; got {metric!r} (use action mask with a KL metric)"
        )
    if cap is not None and floor is not None and floor > cap:
        raise ValueError(f"behavior_weight_floor {floor} is above behavior_weight_cap {cap}")
    rho = log_ratio.detach()
    if level == "sequence":
        sequences = Sequences.of(mask, cu_seqlens)
        metric_value = sequences.mean(_metric(rho, metric, mask), mask)
        rho = sequences.mean(rho, mask)
        if metric == "ratio":
            metric_value = torch.exp(rho)
    else:
        metric_value = _metric(rho, metric, mask)
    weight = torch.exp(rho)

    out = torch.zeros_like(mask)
    if cap is not None:
        out = out | (metric_value > cap)
    if floor is not None:
        out = out | (metric_value < floor)
    out = out & mask
    if action == "mask":
        kept = mask & ~out
    else:
        kept = mask
        low = floor if floor is not None else 0.0
        weight = torch.where(out, weight.clamp(low, cap if cap is not None else torch.inf), weight)
    # where(), not a product: a masked weight may be inf, and inf · 0 is NaN.
    weight = torch.where(kept, weight, torch.zeros((), dtype=weight.dtype, device=weight.device))
    return BehaviorWeight(weight=weight, kept=kept, bounded=out)


def _metric(rho: Tensor, metric: str, mask: Tensor) -> Tensor:
    """The per-token metric of :func:`behavior_weight`, 0 where ``mask`` is 0."""
    if metric == "ratio":
        value = torch.exp(rho)
    elif metric == "k1":
        value = -rho
    elif metric == "k2":
        value = 0.5 * rho * rho
    else:
        value = torch.expm1(rho) - rho
    return torch.where(mask, value, torch.zeros((), dtype=value.dtype, device=value.device))
