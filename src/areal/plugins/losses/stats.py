"""The statistics the built-in losses share, so the step's ``[train]`` line reads the same names
whichever loss ran (docs/training.md, "Loss statistics")."""

from __future__ import annotations

import torch
from torch import Tensor

from areal.plugins.losses.behavior_weight import BehaviorWeight

__all__ = ["common_stats", "stats_to_floats"]


def common_stats(
    *, ratio: Tensor, log_ratio: Tensor, mask: Tensor, rule: BehaviorWeight | None
) -> dict[str, Tensor]:
    """Per valid token: ``ratio_mean`` (π_θ/π_prox), ``approx_kl`` (k3 ``r − 1 − log r`` of
    KL(π_prox ‖ π_θ)), ``behavior_weight_mean`` (over the tokens the rule kept; 1 without a rule),
    ``cap_masked_fraction`` (tokens the rule masked or clamped), ``n_valid_tokens``."""
    with torch.no_grad():
        zero = torch.zeros((), dtype=ratio.dtype, device=ratio.device)
        n_valid = mask.sum()
        denom = n_valid.clamp(min=1).to(ratio.dtype)
        r = torch.where(mask, ratio.detach(), zero)
        k3 = torch.where(mask, r - 1.0 - torch.where(mask, log_ratio.detach(), zero), zero)
        stats = {"ratio_mean": r.sum() / denom, "approx_kl": k3.sum() / denom}
        if rule is None:
            stats["behavior_weight_mean"] = torch.ones((), dtype=ratio.dtype)
            stats["cap_masked_fraction"] = zero
        else:
            stats["behavior_weight_mean"] = rule.weight.sum() / rule.kept.sum().clamp(min=1)
            stats["cap_masked_fraction"] = rule.bounded.sum() / denom
        stats["n_valid_tokens"] = n_valid
    return stats


def stats_to_floats(stats: dict[str, Tensor]) -> dict[str, float]:
    """Tensor statistics as Python floats with one device-to-host copy for all of them."""
    values = torch.stack(
        [
            v.detach().to(device=stats["n_valid_tokens"].device, dtype=torch.float64).reshape(())
            for v in stats.values()
        ]
    )
    return dict(zip(stats, values.tolist(), strict=True))
