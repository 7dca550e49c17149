"""Advantage estimators and reward shaping against values worked out by hand."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from areal.core.plugins import make_plugin_manager, registry
from areal.plugins.losses.advantages import (
    broadcast_to_tokens,
    gae_advantages,
    gae_no_critic_advantages,
    gae_token_advantages,
    grpo_advantages,
    grpo_token_advantages,
    kl_penalized_rewards,
    normalize_batch_advantages,
    rloo_advantages,
    rloo_token_advantages,
    sequence_rewards_to_tokens,
    turn_rewards_on_tokens,
)

INF = math.inf

# Two interleaved groups: task 7 has rewards 1, 0, 1, 0 (mean 0.5, unbiased std √(1/3));
# task 3 has 0, 3, 6 (mean 3, unbiased std √((9 + 0 + 9) / 2) = 3).
REWARDS = torch.tensor([1.0, 0.0, 0.0, 3.0, 1.0, 6.0, 0.0], dtype=torch.float64)
GROUPS = torch.tensor([7, 3, 7, 3, 7, 3, 7])


def close(actual: torch.Tensor, expected: list) -> None:
    torch.testing.assert_close(
        actual, torch.tensor(expected, dtype=actual.dtype), rtol=0, atol=1e-12
    )


def test_grpo_normalises_within_each_group() -> None:
    s7 = math.sqrt(1 / 3) + 1e-6
    s3 = 3 + 1e-6
    close(
        grpo_advantages(REWARDS, GROUPS, eps=1e-6),
        [0.5 / s7, -3 / s3, -0.5 / s7, 0.0, 0.5 / s7, 3 / s3, -0.5 / s7],
    )


def test_grpo_without_std_keeps_only_the_mean_baseline() -> None:
    close(
        grpo_advantages(REWARDS, GROUPS, normalize_std=False),
        [0.5, -3.0, -0.5, 0.0, 0.5, 3.0, -0.5],
    )


def test_rloo_subtracts_the_mean_of_the_others() -> None:
    """Task 7: a 1 is compared with (1+0+0)/3, a 0 with (1+1+0)/3. Task 3: 0 vs 4.5, 3 vs 3,
    6 vs 1.5."""
    close(
        rloo_advantages(REWARDS, GROUPS),
        [2 / 3, -4.5, -2 / 3, 0.0, 2 / 3, 4.5, -2 / 3],
    )


def test_groups_of_one_and_groups_without_spread_give_zero() -> None:
    rewards = torch.tensor([5.0, 1.0, 1.0])
    groups = torch.tensor([0, 1, 1])
    close(grpo_advantages(rewards, groups), [0.0, 0.0, 0.0])
    close(rloo_advantages(rewards, groups), [0.0, 0.0, 0.0])


def test_integer_rewards_and_float32_are_kept_sensible() -> None:
    adv = grpo_advantages(torch.tensor([1.0, 0.0], dtype=torch.float32), torch.tensor([0, 0]))
    assert adv.dtype == torch.float32
    assert torch.isfinite(adv).all()
    rule = torch.tensor([1, 0, 0, 1])  # 0/1 from a rule reward, as integers
    close(rloo_advantages(rule, torch.tensor([0, 0, 1, 1])), [1.0, -1.0, -1.0, 1.0])
    assert grpo_advantages(rule, torch.tensor([0, 0, 1, 1])).is_floating_point()
    with pytest.raises(ValueError, match=r"\[N\]"):
        grpo_advantages(torch.zeros(2, 3), torch.zeros(2, 3))


def test_gae_on_a_four_step_sequence() -> None:
    """γ = λ = 0.5, r = [0, 1, 0, 2], V = [1, 2, 0, 4], V after the end = 0:
    δ3 = 2 − 4 = −2            A3 = −2
    δ2 = 0 + 0.5·4 − 0 = 2     A2 = 2 + 0.25·(−2) = 1.5
    δ1 = 1 + 0.5·0 − 2 = −1    A1 = −1 + 0.25·1.5 = −0.625
    δ0 = 0 + 0.5·2 − 1 = 0     A0 = 0.25·(−0.625) = −0.15625
    """
    rewards = torch.tensor([[0.0, 1.0, 0.0, 2.0]])
    values = torch.tensor([[1.0, 2.0, 0.0, 4.0]])
    mask = torch.ones(1, 4)
    close(
        gae_advantages(rewards, values, mask, gamma=0.5, lam=0.5), [[-0.15625, -0.625, 1.5, -2.0]]
    )


def test_gae_skips_masked_tokens_between_turns() -> None:
    """The same four actions with an environment token (garbage reward and value) between the 2nd
    and 3rd, and padding after: the masked positions are not steps, and get 0."""
    rewards = torch.tensor([[0.0, 1.0, 100.0, 0.0, 2.0, INF]])
    values = torch.tensor([[1.0, 2.0, 50.0, 0.0, 4.0, -INF]])
    mask = torch.tensor([[1, 1, 0, 1, 1, 0]])
    close(
        gae_advantages(rewards, values, mask, gamma=0.5, lam=0.5),
        [[-0.15625, -0.625, 0.0, 1.5, -2.0, 0.0]],
    )


def test_gae_without_a_critic_discounts_the_final_reward() -> None:
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    close(gae_no_critic_advantages(rewards, mask), [[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    close(
        gae_no_critic_advantages(rewards, mask, gamma=0.5, lam=1.0),
        [[0.125, 0.25, 0.5, 1.0], [0.25, 0.5, 1.0, 0.0]],
    )


def test_sequence_rewards_land_on_the_last_generated_token() -> None:
    mask = torch.tensor([[0, 1, 1, 0], [1, 0, 1, 1], [0, 0, 0, 0]])
    close(
        sequence_rewards_to_tokens(torch.tensor([2.0, 3.0, 4.0]), mask),
        [[0.0, 0.0, 2.0, 0.0], [0.0, 0.0, 0.0, 3.0], [0.0, 0.0, 0.0, 0.0]],
    )


def test_broadcast_copies_a_sequence_advantage_to_its_generated_tokens() -> None:
    mask = torch.tensor([[0, 1, 1, 0], [1, 0, 1, 1]])
    close(
        broadcast_to_tokens(torch.tensor([0.5, -2.0]), mask),
        [[0.0, 0.5, 0.5, 0.0], [-2.0, 0.0, -2.0, -2.0]],
    )


def test_kl_penalty_is_subtracted_per_token_and_the_reward_added_at_the_end() -> None:
    """kl_coef = 0.1; log π − log π_ref = [0.5, −1, 0] → rewards −0.05, +0.1, 0 + 1."""
    logprobs = torch.tensor([[-1.0, -2.0, -0.5, -INF]])
    ref = torch.tensor([[-1.5, -1.0, -0.5, -INF]])
    mask = torch.tensor([[1, 1, 1, 0]])
    shaped = kl_penalized_rewards(torch.tensor([1.0]), logprobs, ref, mask, kl_coef=0.1)
    torch.testing.assert_close(shaped, torch.tensor([[-0.05, 0.1, 1.0, 0.0]]))


def test_grpo_then_gae_without_critic_equals_broadcasting() -> None:
    """AReaL's path (normalised reward on the last token, GAE with γ = λ = 1, values 0) gives
    every generated token its sample's advantage."""
    adv = grpo_advantages(REWARDS, GROUPS)
    mask = torch.tensor([[1, 1, 0, 1]] * 7)
    via_gae = gae_no_critic_advantages(sequence_rewards_to_tokens(adv, mask), mask)
    torch.testing.assert_close(via_gae, broadcast_to_tokens(adv, mask))


def test_advantage_estimators_are_registered_by_name() -> None:
    losses = registry("losses", make_plugin_manager(load_entry_points=False))
    mask = torch.tensor([[1, 1, 0]] * 7)
    for name, per_sample in [
        ("advantage/grpo", grpo_advantages(REWARDS, GROUPS)),
        ("advantage/rloo", rloo_advantages(REWARDS, GROUPS)),
        ("advantage/gae", REWARDS),  # γ = λ = 1, no critic: the raw reward on every token
    ]:
        fn = losses.get(name)
        out = fn(rewards=REWARDS, group_ids=GROUPS, loss_mask=mask)
        torch.testing.assert_close(out, broadcast_to_tokens(per_sample, mask))


def test_registering_the_losses_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from areal.core.plugins import make_plugin_manager, registry\n"
        "names = registry('losses', make_plugin_manager(load_entry_points=False)).names()\n"
        "assert 'decoupled_ppo' in names and 'advantage/grpo' in names, names\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_batch_normalisation_over_all_valid_tokens() -> None:
    """Valid advantages 1, 3, 5 (two samples): mean 3, population std √(8/3); masked → 0."""
    adv = torch.tensor([[1.0, 3.0, 9.0], [5.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = normalize_batch_advantages(adv, mask, eps=0.0)
    z = 2 / math.sqrt(8 / 3)
    torch.testing.assert_close(out, torch.tensor([[-z, 0.0, 0.0], [z, 0.0, 0.0]]))
    valid = out[mask.bool()]
    assert valid.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert valid.std(correction=0).item() == pytest.approx(1.0, abs=1e-6)
    # Packed [N] works the same; an all-masked batch stays 0.
    torch.testing.assert_close(
        normalize_batch_advantages(adv.reshape(-1), mask.reshape(-1), eps=0.0), out.reshape(-1)
    )
    assert not normalize_batch_advantages(adv, torch.zeros_like(mask)).any()


# --- per-turn returns: each token valued at its own turn's return ------------------------------

# Two samples of one group, two turns each: [ctx, t0, t0, ctx, t1]; turn returns [2, 1] and [0, 0].
TURN_MASK = torch.tensor([[0, 1, 1, 0, 1], [0, 1, 1, 0, 1]])
TURN_RETURNS = torch.tensor([[0, 2.0, 2.0, 0, 1.0], [0, 0.0, 0.0, 0, 0.0]])
TURN_REWARDS = torch.tensor([2.0, 0.0])  # each sample's first turn


def test_grpo_and_rloo_value_each_token_at_its_turn_return() -> None:
    groups = torch.tensor([0, 0])
    rloo = rloo_token_advantages(
        rewards=TURN_REWARDS, group_ids=groups, loss_mask=TURN_MASK, token_returns=TURN_RETURNS
    )
    close(rloo, [[0, 2, 2, 0, 1], [0, -2, -2, 0, -2]])
    grpo = grpo_token_advantages(
        rewards=TURN_REWARDS, group_ids=groups, loss_mask=TURN_MASK, token_returns=TURN_RETURNS
    )
    std = math.sqrt(2.0)  # of [2, 0], unbiased
    mean = 1.0
    expected = [(g - mean) / (std + 1e-6) for g in (2, 1, 0)]
    want = [[0, expected[0], expected[0], 0, expected[1]], [0, *[expected[2]] * 2, 0, expected[2]]]
    torch.testing.assert_close(grpo, torch.tensor(want, dtype=grpo.dtype))


def test_without_turn_rewards_turn_returns_change_nothing() -> None:
    groups, rewards = torch.tensor([0, 0, 1]), torch.tensor([1.0, 0.0, 3.0])
    mask = torch.tensor([[1, 1, 0], [0, 1, 1], [1, 0, 1]])
    returns = torch.where(mask.bool(), rewards[:, None], 0.0)
    for fn in (grpo_token_advantages, rloo_token_advantages, gae_token_advantages):
        plain = fn(rewards=rewards, group_ids=groups, loss_mask=mask)
        turned = fn(rewards=rewards, group_ids=groups, loss_mask=mask, token_returns=returns)
        torch.testing.assert_close(turned, plain)


def test_a_group_of_one_still_teaches_nothing_per_turn() -> None:
    adv = grpo_token_advantages(
        rewards=TURN_REWARDS[:1],
        group_ids=torch.tensor([0]),
        loss_mask=TURN_MASK[:1],
        token_returns=TURN_RETURNS[:1],
    )
    close(adv, [[0, 0, 0, 0, 0]])


def test_gae_credits_turns_and_discounts_per_token_only_when_told() -> None:
    # Per-turn discount lives in the returns; GAE's defaults (γ = λ = 1) add no per-token decay.
    adv = gae_token_advantages(
        rewards=TURN_REWARDS, group_ids=torch.tensor([0, 0]), loss_mask=TURN_MASK,
        token_returns=TURN_RETURNS,
    )  # fmt: skip
    close(adv, TURN_RETURNS.tolist())
    rewards_on_tokens = turn_rewards_on_tokens(TURN_RETURNS, TURN_MASK)
    close(rewards_on_tokens, [[0, 0, 1, 0, 1], [0, 0, 0, 0, 0]])  # where each turn ends
    decayed = gae_token_advantages(
        rewards=TURN_REWARDS, group_ids=torch.tensor([0, 0]), loss_mask=TURN_MASK,
        token_returns=TURN_RETURNS, gamma=0.5,
    )  # fmt: skip
    # Token by token from the end: 1; 1 + 0.5·1 (turn 0's end; masked context is no step); ...
    close(decayed[0], [0, 0.75, 1.5, 0, 1])
