"""SAPO and CISPO against values worked out by hand, forward and gradient, on packed 1-D inputs
with ``cu_seqlens`` (two sequences, one masked position holding garbage)."""

from __future__ import annotations

import math

import pytest
import torch

from areal.plugins.losses.cispo import cispo_loss
from areal.plugins.losses.sapo import sapo_loss

NAN = math.nan
MASK = torch.tensor([1, 1, 0, 1, 1], dtype=torch.bool)
CU = torch.tensor([0, 2, 5])


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def inputs(
    ratio: list[float], adv: list[float], weight: list[float], logp: list[float]
) -> dict[str, torch.Tensor]:
    """log π_θ = ``logp``; π_prox = π_θ / r; π_behav = π_prox / w; garbage where masked."""
    lp = torch.tensor(logp, dtype=torch.float64)
    prox = lp - torch.tensor(ratio, dtype=torch.float64).log()
    behav = prox - torch.tensor(weight, dtype=torch.float64).log()
    return {
        "logprobs": torch.where(MASK, lp, NAN).requires_grad_(),
        "proximal_logprobs": torch.where(MASK, prox, -math.inf),
        "behavior_logprobs": torch.where(MASK, behav, NAN),
        "advantages": torch.tensor(adv, dtype=torch.float64),
        "loss_mask": MASK,
        "cu_seqlens": CU,
    }


def test_sapo_gates_the_ratio_smoothly_by_the_advantage_sign() -> None:
    """τ_pos = 1, τ_neg = 2; f(r) = σ(τ(r − 1))·4/τ, loss_t = −w·f·A, d/d log π_θ = −w·A·4σ(1−σ)·r.

    (r, A, w)       f                        loss_t          gradient
    (1.0, +1, 1)    σ(0)·4 = 2               −2              −1
    (1.5, −1, 1)    σ(1)·2 = 1.4621          +1.4621         4σ(1)(1−σ(1))·1.5 = 1.1797
    masked
    (0.8, +2, 1)    σ(−0.2)·4 = 1.8007       −3.6013         −2·4σ(−.2)(1−σ(−.2))·0.8
    (1.2, −1, 2)    σ(0.4)·2 = 1.1974        +2.3947         2·4σ(.4)(1−σ(.4))·1.2
    """
    batch = inputs([1.0, 1.5, 1.0, 0.8, 1.2], [1, -1, 0, 2, -1], [1, 1, 1, 1, 2], [-1] * 5)
    loss, stats = sapo_loss(**batch, tau_pos=1.0, tau_neg=2.0)
    s1, s2, s4 = sigmoid(1.0), sigmoid(-0.2), sigmoid(0.4)
    per_token = [-2.0, 2 * s1, -2 * 4 * s2, 2 * 2 * s4]
    assert loss.item() == pytest.approx(sum(per_token) / 4, abs=1e-12)
    grad = [-1.0, 4 * s1 * (1 - s1) * 1.5, 0.0, -2 * 4 * s2 * (1 - s2) * 0.8]
    grad.append(2 * 4 * s4 * (1 - s4) * 1.2)
    loss.backward()
    assert batch["logprobs"].grad is not None
    assert (batch["logprobs"].grad * 4).tolist() == pytest.approx(grad, abs=1e-12)
    gate = [1.0, 4 * s1 * (1 - s1), 4 * s2 * (1 - s2), 4 * s4 * (1 - s4)]
    assert stats["gate_mean"] == pytest.approx(sum(gate) / 4, abs=1e-12)
    assert stats["ratio_mean"] == pytest.approx(4.5 / 4, abs=1e-12)
    assert stats["n_valid_tokens"] == 4.0 and "clip_fraction" not in stats


def test_sapo_on_policy_is_the_policy_gradient_and_temperatures_must_be_positive() -> None:
    batch = inputs([1.0] * 5, [1, -2, 0, 0.5, -1], [1] * 5, [-1] * 5)
    loss, _ = sapo_loss(**batch)  # the paper's τ_pos = 1, τ_neg = 1.05
    loss.backward()
    assert batch["logprobs"].grad is not None
    assert (batch["logprobs"].grad * 4).tolist() == pytest.approx([-1, 2, 0, -0.5, 1], abs=1e-12)
    with pytest.raises(ValueError, match="tau_pos"):
        sapo_loss(**inputs([1.0] * 5, [1] * 5, [1] * 5, [-1] * 5), tau_pos=0.0)


def test_cispo_clips_the_weight_and_keeps_every_gradient() -> None:
    """ε_high = 0.2, no lower bound; loss_t = −clip(r)·w·A·log π_θ, gradient −clip(r)·w·A.

    (r, A, w, log π_θ)       clip(r)   loss_t                gradient
    (1.5, +1, 1,   −1)       1.2       −1.2·1·(−1) = 1.2     −1.2   (clipped, still a gradient)
    (0.5, +2, 1,   −2)       0.5       2.0                   −1.0
    (1.0, −1, 1, −0.5)       1.0       −0.5                  +1.0
    masked
    (1.1, −2, 0.5, −3)       1.1       −3.3                  +1.1
    Sum −0.6 over 4 tokens.
    """
    # Packed order: the table's first two tokens, the masked slot, the last two.
    table = ([1.5, 0.5, 1.0, 1.0, 1.1], [1.0, 2.0, 0.0, -1.0, -2.0], [1, 1, 1, 1, 0.5])
    batch = inputs(*table, [-1.0, -2.0, 0.0, -0.5, -3.0])
    loss, stats = cispo_loss(**batch)
    loss.backward()
    assert batch["logprobs"].grad is not None
    assert loss.item() == pytest.approx(-0.6 / 4, abs=1e-12)
    assert stats["clip_fraction"] == pytest.approx(1 / 4)
    assert (batch["logprobs"].grad * 4).tolist() == pytest.approx(
        [-1.2, -1.0, 0.0, 1.0, 1.1], abs=1e-12
    )
    # With a lower bound ε_low = 0.2 the second token's weight becomes 0.8: loss 3.2, grad −1.6.
    batch = inputs(*table, [-1.0, -2.0, 0.0, -0.5, -3.0])
    loss, stats = cispo_loss(**batch, eps_clip_low=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(0.6 / 4, abs=1e-12)
    assert stats["clip_fraction"] == pytest.approx(2 / 4)
    assert batch["logprobs"].grad is not None
    assert (batch["logprobs"].grad * 4).tolist()[1] == pytest.approx(-1.6, abs=1e-12)
