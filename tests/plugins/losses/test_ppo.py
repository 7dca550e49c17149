"""Decoupled PPO against values worked out by hand, its gradient, and NaN-freedom at masked tokens.

The 2×4 batch below has, with ε = 0.2 and a behaviour-weight cap of 2 (r = π_θ/π_prox,
w = π_prox/π_behav, A = advantage; per-token loss = −w · min(r·A, clip(r)·A)):

    (0,0) r=1.1 A=+1 w=1    inside the clip range         −1.1
    (0,1) r=1.5 A=+2 w=1    clipped at 1.2                −2.4   clipped
    (0,2) r=0.7 A=+2 w=1    outside the range, but r·A is the smaller term: not clipped  −1.4
    (0,3) masked (garbage: -inf, NaN, inf)                  0
    (1,0) r=0.5 A=+1 w=3    w > cap: masked by the cap      0
    (1,1) r=0.9 A=−1 w=1.5  inside the range              +1.35
    (1,2) r=0.7 A=−2 w=1    clipped at 0.8                +1.6   clipped
    (1,3) masked                                            0

Sum −1.95 over 6 valid tokens (the capped one counts): loss = −0.325.
"""

from __future__ import annotations

import math

import pytest
import torch

from areal.core.plugins import make_plugin_manager, registry
from areal.plugins.losses.ppo import decoupled_ppo_loss, loglinear_proximal_logprobs

NAN, INF = math.nan, math.inf

RATIO = [[1.1, 1.5, 0.7, 1.0], [0.5, 0.9, 0.7, 1.0]]
WEIGHT = [[1.0, 1.0, 1.0, 1.0], [3.0, 1.5, 1.0, 1.0]]
ADV = [[1.0, 2.0, 2.0, NAN], [1.0, -1.0, -2.0, INF]]
MASK = [[1, 1, 1, 0], [1, 1, 1, 0]]


def batch(dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    """log π_prox = −1 everywhere valid; log π_θ and log π_behav follow from r and w."""
    prox = torch.full((2, 4), -1.0, dtype=dtype)
    logp = prox + torch.tensor(RATIO, dtype=dtype).log()
    behav = prox - torch.tensor(WEIGHT, dtype=dtype).log()
    # Garbage where the mask is 0: what padding or a prompt position may really hold.
    logp[0, 3], prox[0, 3], behav[0, 3] = -INF, -INF, NAN
    logp[1, 3], prox[1, 3], behav[1, 3] = NAN, INF, -INF
    return {
        "logprobs": logp.requires_grad_(),
        "proximal_logprobs": prox,
        "behavior_logprobs": behav,
        "advantages": torch.tensor(ADV, dtype=dtype),
        "loss_mask": torch.tensor(MASK),
    }


def test_loss_and_stats_match_the_hand_computed_example() -> None:
    loss, stats = decoupled_ppo_loss(**batch(), eps_clip=0.2, behavior_weight_cap=2.0)
    assert loss.item() == pytest.approx(-1.95 / 6, abs=1e-12)
    k3 = sum(r - 1 - math.log(r) for r in [1.1, 1.5, 0.7, 0.5, 0.9, 0.7]) / 6
    assert stats == pytest.approx(
        {
            "clip_fraction": 2 / 6,
            "ratio_mean": 5.4 / 6,
            "behavior_weight_mean": (1 + 1 + 1 + 1.5 + 1) / 5,  # over the 5 tokens the cap kept
            "cap_masked_fraction": 1 / 6,
            "approx_kl": k3,
            "n_valid_tokens": 6.0,
        },
        abs=1e-12,
    )
    assert all(isinstance(v, float) for v in stats.values())


def test_gradient_matches_the_analytic_one() -> None:
    """d loss / d log π_θ = −w·A·r / n where the unclipped term is active, else 0."""
    inputs = batch()
    loss, _ = decoupled_ppo_loss(**inputs, eps_clip=0.2, behavior_weight_cap=2.0)
    loss.backward()
    expected = (
        torch.tensor([[-1.1, 0.0, -1.4, 0.0], [0.0, 1.35, 0.0, 0.0]], dtype=torch.float64) / 6
    )
    grad = inputs["logprobs"].grad
    assert grad is not None
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-12)


def test_gradient_flows_only_through_logprobs() -> None:
    inputs = batch()
    for name in ("proximal_logprobs", "behavior_logprobs", "advantages"):
        inputs[name].requires_grad_()
    loss, _ = decoupled_ppo_loss(**inputs, behavior_weight_cap=2.0)
    loss.backward()
    assert inputs["logprobs"].grad is not None
    for name in ("proximal_logprobs", "behavior_logprobs", "advantages"):
        assert inputs[name].grad is None, name


def test_garbage_at_masked_positions_never_makes_nan_even_without_a_cap() -> None:
    inputs = batch(torch.float32)
    loss, stats = decoupled_ppo_loss(**inputs)
    loss.backward()
    grad = inputs["logprobs"].grad
    assert grad is not None
    assert torch.isfinite(loss)
    assert torch.isfinite(grad).all()
    assert (grad[:, 3] == 0).all()
    assert all(math.isfinite(v) for v in stats.values())
    # Without the cap token (1,0) counts with its weight 3: −1·0.5·3 more in the sum.
    assert loss.item() == pytest.approx((-1.95 - 1.5) / 6, abs=1e-6)


def test_packed_1d_input_gives_the_same_loss() -> None:
    padded, _ = decoupled_ppo_loss(**batch(), behavior_weight_cap=2.0)
    packed_inputs = {k: v.detach().reshape(-1) for k, v in batch().items()}
    packed, stats = decoupled_ppo_loss(**packed_inputs, behavior_weight_cap=2.0)
    assert packed.item() == pytest.approx(padded.item(), abs=1e-12)
    assert stats["n_valid_tokens"] == 6


def test_clip_higher_lets_the_rising_token_through() -> None:
    """With ε_high = 0.6, r = 1.5 is inside [0.8, 1.6]: token (0,1) adds −3.0 instead of −2.4."""
    loss, stats = decoupled_ppo_loss(**batch(), eps_clip_high=0.6, behavior_weight_cap=2.0)
    assert loss.item() == pytest.approx((-1.95 - 0.6) / 6, abs=1e-12)
    assert stats["clip_fraction"] == pytest.approx(1 / 6)


def test_an_all_masked_batch_has_zero_loss() -> None:
    inputs = batch()
    inputs["loss_mask"] = torch.zeros(2, 4, dtype=torch.long)
    loss, stats = decoupled_ppo_loss(**inputs)
    assert loss.item() == 0.0
    assert stats["n_valid_tokens"] == 0.0


def test_mismatched_shapes_are_refused() -> None:
    inputs = batch()
    inputs["advantages"] = inputs["advantages"][:, :3]
    with pytest.raises(ValueError, match="one shape"):
        decoupled_ppo_loss(**inputs)


def test_loglinear_proximal_logprobs_interpolate_by_version() -> None:
    """v_θ = 5 so v_prox = 4. α = (4 − v)/(5 − v): v=4 → 0, v=2 → 2/3, v=0 → 4/5;
    v=5 (newer than the proximal weights) and v=−1 (a prompt token) → 0."""
    behav = torch.tensor([[-2.0, -2.0, -2.0, -2.0, -INF]], dtype=torch.float64)
    logp = torch.tensor([[-1.0, -0.5, -3.0, -1.0, -INF]], dtype=torch.float64)
    versions = torch.tensor([[4, 2, 0, 5, -1]])
    prox = loglinear_proximal_logprobs(
        behavior_logprobs=behav, logprobs=logp.requires_grad_(), versions=versions,
        current_version=5,
    )  # fmt: skip
    expected = torch.tensor(
        [[-2.0, -2.0 + (2 / 3) * 1.5, -2.0 + (4 / 5) * -1.0, -2.0, -INF]], dtype=torch.float64
    )
    torch.testing.assert_close(prox, expected, rtol=0, atol=1e-12)
    assert not prox.requires_grad


def test_the_loss_is_found_in_the_registry_by_name() -> None:
    losses = registry("losses", make_plugin_manager(load_entry_points=False))
    assert "decoupled_ppo" in losses
    loss, _ = losses.get("decoupled_ppo")(**batch(), behavior_weight_cap=2.0)
    assert loss.item() == pytest.approx(-0.325, abs=1e-12)
