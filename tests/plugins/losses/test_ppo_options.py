"""Decoupled PPO's options against values worked out by hand, forward and gradient, on packed
1-D inputs with ``cu_seqlens``: the dual clip, GSPO's sequence ratio, plain PPO."""

from __future__ import annotations

import math

import pytest
import torch

from areal.plugins.losses.ppo import decoupled_ppo_loss, ppo_loss

NAN = math.nan


def packed(
    log_ratio: list[float], adv: list[float], mask: list[int], cu: list[int] | None = None
) -> dict[str, torch.Tensor | None]:
    """log π_prox = log π_behav = −1 (w = 1); log π_θ = −1 + log r; garbage where masked."""
    prox = torch.full((len(log_ratio),), -1.0, dtype=torch.float64)
    logp = prox + torch.tensor(log_ratio, dtype=torch.float64)
    m = torch.tensor(mask, dtype=torch.bool)
    logp = torch.where(m, logp, NAN)
    return {
        "logprobs": logp.requires_grad_(),
        "proximal_logprobs": prox,
        "behavior_logprobs": prox.clone(),
        "advantages": torch.tensor(adv, dtype=torch.float64),
        "loss_mask": m,
        "cu_seqlens": None if cu is None else torch.tensor(cu),
    }


def grad_of(inputs: dict[str, torch.Tensor | None]) -> list[float]:
    logp = inputs["logprobs"]
    assert logp is not None and logp.grad is not None
    return logp.grad.tolist()


def test_dual_clip_bounds_negative_advantages_by_c_clip_times_abs_a() -> None:
    """ε = 0.2, c_clip = 1.5; per token (r, A) → PPO term → dual-clipped term:

    (2.0, −1): max(2.0, 1.2) = 2.0 → min(2.0, 1.5) = 1.5   dual-clipped, no gradient
    (1.1, −1): 1.1, under 1.5                              gradient −A·r = 1.1
    (3.0, +1): max(−3, −1.2) = −1.2 (clipped; A > 0: no dual clip), no gradient
    (0.5, −2): max(1.0, 1.6) = 1.6 (clipped), under 3.0    no gradient
    masked token: 0. Sum 3.0 over 4 valid tokens: 0.75.
    """
    log_r = [math.log(2.0), math.log(1.1), math.log(3.0), math.log(0.5), 0.0]
    inputs = packed(log_r, [-1.0, -1.0, 1.0, -2.0, 5.0], [1, 1, 1, 1, 0], cu=[0, 2, 5])
    loss, stats = decoupled_ppo_loss(**inputs, c_clip=1.5)
    assert loss.item() == pytest.approx(0.75, abs=1e-12)
    assert stats["dual_clip_fraction"] == pytest.approx(1 / 4)
    assert stats["clip_fraction"] == pytest.approx(2 / 4)
    loss.backward()
    assert grad_of(inputs) == pytest.approx([0.0, 1.1 / 4, 0.0, 0.0, 0.0], abs=1e-12)
    # Without c_clip the first token adds 2.0 (not 1.5) and has the gradient −A·r = 2.
    inputs = packed(log_r, [-1.0, -1.0, 1.0, -2.0, 5.0], [1, 1, 1, 1, 0], cu=[0, 2, 5])
    loss, stats = decoupled_ppo_loss(**inputs)
    assert loss.item() == pytest.approx(3.5 / 4, abs=1e-12) and "dual_clip_fraction" not in stats
    loss.backward()
    assert grad_of(inputs) == pytest.approx([2 / 4, 1.1 / 4, 0.0, 0.0, 0.0], abs=1e-12)


def test_c_clip_must_be_above_one() -> None:
    with pytest.raises(ValueError, match="c_clip"):
        decoupled_ppo_loss(**packed([0.0], [1.0], [1]), c_clip=1.0)


# Three packed sequences (cu_seqlens 0, 3, 5, 7), positions 0 and 5 masked. Token log-ratios:
# A: 0.1, 0.3 → mean 0.2, s = e^0.2 ≈ 1.2214;  B: −0.1, 0.1 → s = 1;  C: 0.05 → s = e^0.05.
GSPO_LOG_R = [9.0, 0.1, 0.3, -0.1, 0.1, 9.0, 0.05]
GSPO_ADV = [0.0, 1.0, 1.0, 2.0, -1.0, 0.0, -1.0]
GSPO_MASK = [0, 1, 1, 1, 1, 0, 1]
GSPO_CU = [0, 3, 5, 7]


def test_gspo_clips_whole_sequences_with_the_token_form_gradient() -> None:
    """Sequence A (s > 1.2, A > 0) is clipped as a whole: −1.2 per token, no gradient, although
    its first token alone (r = e^0.1) is inside the range. B: −A·s = −2 and +1, gradients −A·s.
    C: −(−1)·e^0.05, unclipped. Loss (−2.4 − 2 + 1 + e^0.05) / 5."""
    inputs = packed(GSPO_LOG_R, GSPO_ADV, GSPO_MASK, GSPO_CU)
    loss, stats = decoupled_ppo_loss(**inputs, importance_sampling_level="sequence")
    s_c = math.exp(0.05)
    assert loss.item() == pytest.approx((-2.4 - 2.0 + 1.0 + s_c) / 5, abs=1e-12)
    assert stats["clip_fraction"] == pytest.approx(2 / 5)
    assert stats["ratio_mean"] == pytest.approx((2 * math.exp(0.2) + 2 + s_c) / 5, abs=1e-12)
    loss.backward()
    assert grad_of(inputs) == pytest.approx([0, 0, 0, -2 / 5, 1 / 5, 0, s_c / 5], abs=1e-12)


def test_gspo_token_level_differs_and_padded_rows_agree_with_packed() -> None:
    token = packed(GSPO_LOG_R, GSPO_ADV, GSPO_MASK, GSPO_CU)
    loss_token, _ = decoupled_ppo_loss(**token)
    loss_token.backward()
    assert grad_of(token)[1] == pytest.approx(-math.exp(0.1) / 5)  # unclipped alone
    # The same three sequences as [3, 3] rows (padding masked): the same loss and gradient.
    rows = [[0, 1, 2], [3, 4, 5], [6, 5, 5]]
    row_mask = [[0, 1, 1], [1, 1, 0], [1, 0, 0]]
    flat = packed(GSPO_LOG_R, GSPO_ADV, GSPO_MASK, GSPO_CU)
    padded: dict[str, torch.Tensor | None] = {}
    for name in ("proximal_logprobs", "behavior_logprobs", "advantages"):
        value = flat[name]
        assert value is not None
        padded[name] = value[torch.tensor(rows)]
    logp = flat["logprobs"]
    assert logp is not None
    leaf = logp.detach()[torch.tensor(rows)].requires_grad_()
    padded.update(logprobs=leaf, loss_mask=torch.tensor(row_mask, dtype=torch.bool))
    loss_rows, _ = decoupled_ppo_loss(**padded, importance_sampling_level="sequence")
    loss_packed, _ = decoupled_ppo_loss(**flat, importance_sampling_level="sequence")
    assert loss_rows.item() == pytest.approx(loss_packed.item(), abs=1e-12)
    loss_rows.backward()
    assert leaf.grad is not None
    assert leaf.grad[1, 0].item() == pytest.approx(-2 / 5, abs=1e-12)


def test_sequence_level_needs_the_sequences() -> None:
    with pytest.raises(ValueError, match="cu_seqlens"):
        decoupled_ppo_loss(
            **packed(GSPO_LOG_R, GSPO_ADV, GSPO_MASK), importance_sampling_level="sequence"
        )
    with pytest.raises(ValueError, match="importance_sampling_level"):
        decoupled_ppo_loss(**packed([0.0], [1.0], [1]), importance_sampling_level="seq")


def test_plain_ppo_anchors_at_the_behaviour_policy_and_ignores_prox() -> None:
    """r = π_θ/π_behav = 1.5 (A = +1: clipped, −1.2) and 0.9 (A = −1: +0.9, gradient 0.9)."""
    inputs = packed([math.log(1.5), math.log(0.9)], [1.0, -1.0], [1, 1], cu=[0, 1, 2])
    inputs["proximal_logprobs"] = torch.tensor([NAN, 5.0], dtype=torch.float64)  # never read
    loss, stats = ppo_loss(**inputs)
    assert loss.item() == pytest.approx(-0.15, abs=1e-12)
    assert stats["behavior_weight_mean"] == 1.0 and stats["cap_masked_fraction"] == 0.0
    loss.backward()
    assert grad_of(inputs) == pytest.approx([0.0, 0.45], abs=1e-12)
