"""The behaviour-weight rule (mask or clamp, cap and floor, token or sequence level, ratio or KL
metric) against weights worked out by hand, alone and inside decoupled PPO.

Three packed sequences (cu_seqlens 0, 3, 5, 7), positions 0 and 5 masked, w = π_prox/π_behav:

    A: w = 3, 1     geometric mean √3 ≈ 1.732
    B: w = 0.25, 1  geometric mean 0.5
    C: w = 1.5      geometric mean 1.5

KL estimates per token with ρ = log w (of KL(π_behav ‖ π_prox), tokens sampled by π_behav):
k1 = −ρ, k2 = ρ²/2, k3 = w − 1 − ρ; k3 is 0.9014 (w = 3), 0.6363 (w = 0.25), 0.0945 (w = 1.5).
These check the definitions in docs/training.md; tests/references/test_areal.py checks the same
options against AReaL's own function.
"""

from __future__ import annotations

import math

import pytest
import torch

from areal.plugins.losses.behavior_weight import behavior_weight
from areal.plugins.losses.ppo import decoupled_ppo_loss

W = [7.0, 3.0, 1.0, 0.25, 1.0, 7.0, 1.5]  # 7.0 at the masked positions: never read
MASK = torch.tensor([0, 1, 1, 1, 1, 0, 1], dtype=torch.bool)
CU = torch.tensor([0, 3, 5, 7])
R3 = math.sqrt(3.0)


def weights(**rule: object) -> tuple[list[float], float]:
    log_ratio = torch.where(MASK, torch.tensor(W, dtype=torch.float64).log(), 0.0)
    out = behavior_weight(log_ratio=log_ratio, mask=MASK, cu_seqlens=CU, **rule)  # type: ignore[arg-type]
    assert not (out.weight[~out.kept] != 0).any()
    return out.weight.tolist(), float(out.bounded.sum()) / 5


@pytest.mark.parametrize(
    ("rule", "expected", "bounded"),
    [
        ({}, [0, 3, 1, 0.25, 1, 0, 1.5], 0.0),
        ({"cap": 2.0}, [0, 0, 1, 0.25, 1, 0, 1.5], 1 / 5),
        ({"cap": 2.0, "floor": 0.5}, [0, 0, 1, 0, 1, 0, 1.5], 2 / 5),
        ({"cap": 2.0, "floor": 0.5, "action": "clamp"}, [0, 2, 1, 0.5, 1, 0, 1.5], 2 / 5),
        ({"level": "sequence"}, [0, R3, R3, 0.5, 0.5, 0, 1.5], 0.0),
        ({"cap": 1.6, "level": "sequence"}, [0, 0, 0, 0.5, 0.5, 0, 1.5], 2 / 5),
        (
            {"cap": 1.6, "floor": 0.6, "level": "sequence", "action": "clamp"},
            [0, 1.6, 1.6, 0.6, 0.6, 0, 1.5],
            4 / 5,
        ),
        ({"cap": 0.3, "metric": "k3"}, [0, 0, 1, 0, 1, 0, 1.5], 2 / 5),
        ({"cap": 1.0, "metric": "k1"}, [0, 3, 1, 0, 1, 0, 1.5], 1 / 5),  # k1(0.25) = 1.386
        ({"cap": 0.5, "metric": "k2"}, [0, 0, 1, 0, 1, 0, 1.5], 2 / 5),  # 0.603, 0.961
        # Sequence means of k3: A 0.4507, B 0.3181, C 0.0945; with a KL metric the level only
        # picks the sequences, and each kept token keeps its own weight (as in AReaL).
        ({"cap": 0.4, "metric": "k3", "level": "sequence"}, [0, 0, 0, 0.25, 1, 0, 1.5], 2 / 5),
        # Maxima of k3: A 0.9014, B 0.6363, C 0.0945.
        (
            {"cap": 0.8, "metric": "k3", "level": "sequence", "agg": "max"},
            [0, 0, 0, 0.25, 1, 0, 1.5],
            2 / 5,
        ),
        # ratio aggregated in log space: sum = product of weights (A 3, B 0.25), max (A 3).
        ({"cap": 2.0, "level": "sequence", "agg": "sum"}, [0, 0, 0, 0.5, 0.5, 0, 1.5], 2 / 5),
        ({"cap": 2.0, "level": "sequence"}, [0, R3, R3, 0.5, 0.5, 0, 1.5], 0.0),
        ({"cap": 2.5, "level": "sequence", "agg": "max"}, [0, 0, 0, 0.5, 0.5, 0, 1.5], 2 / 5),
        # AReaL's kl_k1 = ρ (w = 3: 1.0986) and kl_k3 = 1/w − 1 + ρ (w = 3: 0.4319, w = 0.25:
        # 1.6137, w = 1.5: 0.0721): the opposite direction to k1 and k3.
        ({"cap": 1.0, "metric": "kl_k1"}, [0, 0, 1, 0.25, 1, 0, 1.5], 1 / 5),
        ({"cap": 0.5, "metric": "kl_k3"}, [0, 3, 1, 0, 1, 0, 1.5], 1 / 5),
        ({"cap": 0.5, "metric": "k3"}, [0, 0, 1, 0, 1, 0, 1.5], 2 / 5),
        ({"cap": 0.5, "metric": "kl_k2"}, [0, 0, 1, 0, 1, 0, 1.5], 2 / 5),
        # No behaviour weight at all (AReaL's default): every valid token weighs 1.
        ({"action": "disabled"}, [0, 1, 1, 1, 1, 0, 1], 0.0),
    ],
    ids=lambda v: str(v) if isinstance(v, dict) else "",
)
def test_rules_give_the_hand_computed_weights(
    rule: dict[str, object], expected: list[float], bounded: float
) -> None:
    got, fraction = weights(**rule)
    assert got == pytest.approx(expected, abs=1e-12)
    assert fraction == pytest.approx(bounded)


def test_bad_rules_are_refused_by_option_name() -> None:
    with pytest.raises(ValueError, match="behavior_weight_metric ratio"):
        weights(cap=0.1, metric="k3", action="clamp")
    with pytest.raises(ValueError, match="behavior_weight_level"):
        weights(level="batch")
    with pytest.raises(ValueError, match="behavior_weight_floor"):
        weights(cap=1.0, floor=2.0)
    with pytest.raises(ValueError, match="behavior_weight_agg"):
        weights(level="sequence", agg="median")
    with pytest.raises(ValueError, match=r"behavior_weight_action disabled.*remove them"):
        weights(cap=2.0, action="disabled")


def test_the_rule_inside_decoupled_ppo_forward_and_gradient() -> None:
    """r = 1 everywhere (π_θ = π_prox), A = +1: loss_t = −w_t, d loss / d log π_θ = −w_t / 5.

    Sequence-level clamp to [0.6, 1.6]: weights 1.6, 1.6, 0.6, 0.6, 1.5 → loss −5.9 / 5."""
    prox = torch.full((7,), -1.0, dtype=torch.float64)
    logp = prox.clone().requires_grad_()
    behav = prox - torch.tensor(W, dtype=torch.float64).log()
    loss, stats = decoupled_ppo_loss(
        logprobs=logp,
        proximal_logprobs=prox,
        behavior_logprobs=behav,
        advantages=torch.ones(7, dtype=torch.float64),
        loss_mask=MASK,
        cu_seqlens=CU,
        behavior_weight_cap=1.6,
        behavior_weight_floor=0.6,
        behavior_weight_action="clamp",
        behavior_weight_level="sequence",
    )
    assert loss.item() == pytest.approx(-5.9 / 5, abs=1e-12)
    assert stats["behavior_weight_mean"] == pytest.approx(5.9 / 5)
    assert stats["cap_masked_fraction"] == pytest.approx(4 / 5)
    loss.backward()
    assert logp.grad is not None
    expected = [0, -1.6, -1.6, -0.6, -0.6, 0, -1.5]
    assert (logp.grad * 5).tolist() == pytest.approx(expected, abs=1e-12)
