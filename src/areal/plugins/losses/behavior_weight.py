"""The behaviour importance weight w = π_prox / π_behav and the rule that bounds it.

Decoupled losses correct for stale samples with w, a constant of the step. A few very stale
tokens can have a huge w, so a rule bounds it, as AReaL's ``rejection_sampling`` does:

- **metric** the bound is checked on, per token, with ρ = log π_prox − log π_behav: ``ratio``
  (w = e^ρ itself), or an estimator of KL(π_behav ‖ π_prox) from tokens sampled by π_behav
  (Schulman 2020): ``k1`` = −ρ, ``k2`` = ρ²/2, ``k3`` = e^ρ − 1 − ρ. ``kl_k1``, ``kl_k2`` and
  ``kl_k3`` are AReaL 1.0.4's metrics as its code computes them: ``kl_k1`` = ρ (the negative of
  that estimate), ``kl_k2`` = ρ²/2, ``kl_k3`` = e^−ρ − 1 + ρ (the k3 form of the other direction,
  KL(π_prox ‖ π_behav), evaluated on π_behav's tokens, where it is biased);
- **level**: ``token`` checks every token; ``sequence`` checks each sequence once, on ``agg`` of its
  tokens: for ``ratio`` in log space (``mean``: the geometric mean of the weights, ``sum``: their
  product, ``max``: the largest), for a KL metric on the estimates themselves. With ``ratio`` every
  token of the sequence then carries the sequence's geometric-mean weight; with a KL metric the
  level only decides which sequences stay, and each token keeps its own weight (as in AReaL);
- **action** on a metric above ``cap`` or below ``floor``: ``mask`` drops the token (or the whole
  sequence) from the loss (it still counts in the denominator), ``clamp`` keeps it with its weight
  clamped into ``[floor, cap]`` (``ratio`` only: a KL bound is not a weight); ``disabled`` applies
  no behaviour weight at all (w ≡ 1: AReaL's default, ``rejection_sampling: null``, which makes
  the decoupled loss a PPO anchored at π_prox without off-policy correction).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from areal.plugins.losses.tokens import Sequences, check_choice

__all__ = ["ACTIONS", "AGGS", "LEVELS", "METRICS", "BehaviorWeight", "behavior_weight"]

ACTIONS = ("mask", "clamp", "disabled")
LEVELS = ("token", "sequence")
METRICS = ("ratio", "k1", "k2", "k3", "kl_k1", "kl_k2", "kl_k3")
AGGS = ("mean", "sum", "max")


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
    agg: str = "mean",
) -> BehaviorWeight:
    """Bound ``log_ratio`` = log π_prox − log π_behav (0 where ``mask`` is 0) by the module's rule.

    With neither ``cap`` nor ``floor`` every valid token keeps its own weight (at ``level:
    token``). Option names in errors are the losses' (``behavior_weight_*``).
    """
    check_choice("behavior_weight_action", action, ACTIONS)
    check_choice("behavior_weight_level", level, LEVELS)
    check_choice("behavior_weight_metric", metric, METRICS)
    check_choice("behavior_weight_agg", agg, AGGS)
    if action == "disabled":
        if cap is not None or floor is not None:
            raise ValueError(
                "behavior_weight_action disabled applies no behaviour weight, so "
                "behavior_weight_cap and behavior_weight_floor have nothing to bound: remove "
                "them, or pick action mask or clamp"
            )
        no = torch.zeros_like(mask)
        return BehaviorWeight(weight=mask.to(log_ratio.dtype), kept=mask, bounded=no)
    if action == "clamp" and metric != "ratio":
        raise ValueError(
            "behavior_weight_action clamp bounds the weight itself, so it needs "
            f"behavior_weight_metric ratio; got {metric!r} (use action mask with a KL metric)"
        )
    if cap is not None and floor is not None and floor > cap:
        raise ValueError(f"behavior_weight_floor {floor} is above behavior_weight_cap {cap}")
    rho = log_ratio.detach()
    zero = torch.zeros((), dtype=rho.dtype, device=rho.device)
    if level == "sequence":
        sequences = Sequences.of(mask, cu_seqlens)
        # ratio: aggregated in log space (a product of weights, not a sum of them)
        values = torch.where(mask, rho, zero) if metric == "ratio" else _metric(rho, metric, mask)
        per_seq = _aggregate(sequences, values, mask, agg)
        metric_value = torch.exp(per_seq) if metric == "ratio" else per_seq
        if metric == "ratio":
            rho = sequences.mean(torch.where(mask, rho, zero), mask)
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
    weight = torch.where(kept, weight, zero)
    return BehaviorWeight(weight=weight, kept=kept, bounded=out)


def _aggregate(sequences: Sequences, values: Tensor, mask: Tensor, agg: str) -> Tensor:
    """Each position gets ``agg`` of ``values`` over the valid positions of its sequence (0 for
    a sequence without any, which so stays in bounds)."""
    if agg == "mean":
        return sequences.mean(values, mask)
    flat_index = sequences.index.reshape(-1)
    flat = values.reshape(-1)
    if agg == "sum":
        zeros = torch.zeros(sequences.count, dtype=values.dtype, device=values.device)
        return zeros.index_add(0, flat_index, flat)[sequences.index]
    lowest = torch.full((sequences.count,), -torch.inf, dtype=values.dtype, device=values.device)
    candidates = torch.where(mask.reshape(-1), flat, -torch.inf)
    per_seq = lowest.scatter_reduce(0, flat_index, candidates, reduce="amax")
    per_seq = torch.where(torch.isinf(per_seq), 0.0, per_seq)
    return per_seq[sequences.index]


def _metric(rho: Tensor, metric: str, mask: Tensor) -> Tensor:
    """The per-token metric of :func:`behavior_weight`, 0 where ``mask`` is 0."""
    if metric == "ratio":
        value = torch.exp(rho)
    elif metric == "k1":
        value = -rho
    elif metric == "kl_k1":
        value = rho
    elif metric in ("k2", "kl_k2"):
        value = 0.5 * rho * rho
    elif metric == "k3":
        value = torch.expm1(rho) - rho
    else:  # kl_k3
        value = torch.expm1(-rho) + rho
    return torch.where(mask, value, torch.zeros((), dtype=value.dtype, device=value.device))
