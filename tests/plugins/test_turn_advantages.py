"""Turn-level advantage estimators: exact expected gradients on a task with a closed form, hand-made
batches, and their agreement with RLOO and GRPO on single-turn episodes.

The expected gradients are computed by enumerating every group of episodes with its probability
(``support.turn_credit_task``), so the comparisons are exact, never sampled.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from areal.plugins.losses.advantages import grpo_token_advantages, rloo_token_advantages
from areal.plugins.losses.turn_advantages import gigpo_token_advantages, turn_token_advantages
from support.turn_credit_task import (
    StoppingTask,
    expectation_over_others,
    group_expectation,
    per_turn_index_expected_gradient,
    per_turn_index_normalized_advantages,
)

# Two tasks: intermediate rewards that pay; and a cost per turn (a tool call that costs) against a
# final reward that grows with the turns taken, where going on pays at every turn.
TASKS = [
    StoppingTask(logits=(0.3, -0.2, 0.5), step_reward=1.0, final_rewards=(0.0, 0.5, 1.5, 3.0)),
    StoppingTask(logits=(-0.4, 0.8, 0.1), step_reward=-0.3, final_rewards=(0.0, 1.0, 2.0, 2.5)),
]


def close(actual: torch.Tensor, expected: torch.Tensor, atol: float = 1e-12) -> None:
    torch.testing.assert_close(
        actual.to(torch.float64), expected.to(torch.float64), rtol=0, atol=atol
    )


# --- (a) the bias, exactly ------------------------------------------------------------------------


@pytest.mark.parametrize("task", TASKS)
def test_the_closed_form_gradient_is_the_gradient(task: StoppingTask) -> None:
    """∇J in closed form equals autograd on J(θ) = Σ_K P_θ(K)·(c·K + f(K)) and the
    score-function sum over episodes."""
    theta = torch.tensor(task.logits, dtype=torch.float64, requires_grad=True)
    p = torch.sigmoid(theta)
    objective = 0
    for k in task.lengths():
        prob = torch.prod(p[:k]) * (1 - p[k] if k < task.horizon else 1)
        objective = objective + prob * (task.step_reward * k + task.final_rewards[k])
    objective.backward()
    close(task.gradient(), theta.grad)
    score_function = sum(
        prob * task.returns(k)[0] * task.scores(k).sum(dim=0)
        for k, prob in zip(task.lengths(), task.length_probs())
    )
    close(task.gradient(), score_function)
    close(
        task.objective(),
        sum(p * task.returns(k)[0] for k, p in zip(task.lengths(), task.length_probs())),
    )


@pytest.mark.parametrize("task", TASKS)
def test_per_turn_index_normalisation_is_off_by_the_closed_form_bias(task: StoppingTask) -> None:
    """E[ĝ] of the per-index construction (population group means) is ∇J + β, and β is no
    rounding error: it is a large share of the gradient itself."""
    expected = per_turn_index_expected_gradient(task)
    bias = task.termination_bias()
    close(expected - task.gradient(), bias)
    assert bias.abs().min() > 0.1
    assert (bias.norm() / task.gradient().norm()) > 0.5


def test_where_going_on_pays_the_per_turn_index_estimator_says_stop() -> None:
    """In the second task every decision to go on raises J, and the per-index construction pushes
    every one of them the other way."""
    task = TASKS[1]
    assert (task.gradient() > 0).all()
    assert (per_turn_index_expected_gradient(task) < 0).all()


@pytest.mark.parametrize("task", TASKS)
def test_the_bias_charges_each_continue_the_group_means_it_opens(task: StoppingTask) -> None:
    """β_m = −P(K ≥ m)·p_m(1 − p_m)·E[μ_{m+1} + … + μ_K | K ≥ m + 1]: the accumulated group mean of
    the turns that taking another turn at m opens, averaged by enumeration."""
    p, reach, mu = task.continue_probs(), task.reach_probs(), task.turn_means()
    lengths = task.length_probs()
    for m in range(task.horizon):
        opened = sum(lengths[k] * mu[m + 1 : k + 1].sum() for k in task.lengths() if k > m)
        accumulated = opened / reach[m + 1]
        close(task.termination_bias()[m], -reach[m] * p[m] * (1 - p[m]) * accumulated)


@pytest.mark.parametrize("task", TASKS)
def test_per_turn_index_normalisation_sees_only_the_immediate_reward(task: StoppingTask) -> None:
    """Where the turn index is the state the bias cancels the value of going on exactly:
    what is left is P(K ≥ m)·p_m(1 − p_m)·(c − f(m)), as if every turn were the last."""
    p, reach = task.continue_probs(), task.reach_probs()
    f = torch.tensor(task.final_rewards[:-1], dtype=torch.float64)
    myopic = reach[:-1] * p * (1 - p) * (task.step_reward - f)
    close(per_turn_index_expected_gradient(task), myopic)


def test_per_turn_index_normalisation_on_a_hand_made_group() -> None:
    """Rewards (1, 2), (3,) and (0, 4, 1): μ = (4/3, 3, 1); A_t sums the centred rewards from t."""
    rewards = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0], [0.0, 4.0, 1.0]], dtype=torch.float64)
    reached = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    a = per_turn_index_normalized_advantages(rewards, reached)
    expected = [[-1 / 3 - 1, -1.0, 0.0], [5 / 3, 0.0, 0.0], [-4 / 3 + 1, 1.0, 0.0]]
    close(a, torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("layout", ["merged", "split"])
def test_turn_advantages_are_unbiased_on_finite_groups(
    task: StoppingTask, size: int, layout: str
) -> None:
    """With the default single_sample=reward (baseline 0 for a turn no other episode reached)
    the exact expectation over every group of ``size`` episodes is ∇J, in both layouts."""
    expected = group_expectation(task, turn_token_advantages, size, layout)
    close(expected, task.gradient())


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("size", [2, 4])
def test_zeroing_unmatched_turns_weights_each_turn_by_the_chance_of_a_match(
    task: StoppingTask, size: int
) -> None:
    """single_sample=zero adds no action-dependent term, but turn m's decisions count only when
    some other episode also reached m: E[ĝ]_m = (1 − (1 − P(K ≥ m))^{n−1})·∇_m J. Late, rarely
    reached turns are under-weighted; turn 0 never is."""
    weights = 1 - (1 - task.reach_probs()[:-1]) ** (size - 1)
    expected = group_expectation(task, turn_token_advantages, size, single_sample="zero")
    close(expected, weights * task.gradient())
    assert weights[0] == 1 and weights[-1] < 0.95


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("single_sample", ["reward", "zero"])
def test_the_leave_one_out_std_scales_each_turn_by_a_factor_of_the_others_only(
    task: StoppingTask, single_sample: str
) -> None:
    """normalize_std divides by s_{−i} + eps, the spread of the other episodes' returns, or by 1
    when the others agree: the expected gradient is ∇J scaled by E[that factor] (times the match
    indicator for zero), with the others' spread taken from ``statistics.stdev``."""
    size, eps = 4, 0.1

    def weight(m: int):
        def value(lengths: tuple[int, ...]) -> float:
            spread = statistics.stdev(float(task.returns(k)[0]) for k in lengths)
            matched = single_sample == "reward" or max(lengths) >= m
            return matched / (spread + eps) if spread > 0 else float(matched)

        return expectation_over_others(task, size - 1, value)

    weights = torch.tensor([weight(m) for m in range(task.horizon)], dtype=torch.float64)
    expected = group_expectation(
        task, turn_token_advantages, size, normalize_std=True, eps=eps, single_sample=single_sample
    )
    close(expected, weights * task.gradient(), atol=1e-11)


def test_the_groups_own_std_would_reweight_turns() -> None:
    """Why normalize_std leaves the episode out: dividing by the group's std *including* the
    episode (GRPO's) makes the factor depend on the episode's own return, and long episodes, the
    extreme ones here, are scaled down: turn 2's decisions keep about half the weight of
    turn 0's."""
    task, eps = TASKS[0], 1e-6

    def grpo_scaled(*, rewards, group_ids, loss_mask, token_returns, turn_ids, episode_ids):
        adv = turn_token_advantages(
            rewards=rewards,
            group_ids=group_ids,
            loss_mask=loss_mask,
            token_returns=token_returns,
            turn_ids=turn_ids,
            episode_ids=episode_ids,
            single_sample="reward",
        )
        scale = torch.ones_like(rewards)
        for g in group_ids.unique():
            members = group_ids == g
            scale[members] = statistics.stdev(rewards[members].tolist()) + eps
        return adv / scale[:, None]

    ratio = group_expectation(task, grpo_scaled, 3) / task.gradient()
    assert ratio[2] < 0.6 * ratio[0]


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("step_key", ["observation", "history"])
@pytest.mark.parametrize("layout", ["merged", "split"])
def test_gigpo_without_std_has_no_termination_bias(
    task: StoppingTask, step_key: str, layout: str
) -> None:
    """GiGPO compares returns-to-go, so without std it carries only positive per-turn weights:
    (n − 1)/n from the episode level (each mean includes the episode itself) plus
    step_weight·E[(n_m − 1)/n_m], n_m the episodes of the group at turn m. That the weights come
    out exactly also shows that the anchors group turn m with turn m (the observation renders the
    turn)."""
    size, step_weight = 3, 0.5

    def share(m: int) -> float:
        def value(lengths: tuple[int, ...]) -> float:
            at_m = 1 + sum(k >= m for k in lengths)
            return (at_m - 1) / at_m

        return expectation_over_others(task, size - 1, value)

    weights = torch.tensor(
        [(size - 1) / size + step_weight * share(m) for m in range(task.horizon)],
        dtype=torch.float64,
    )
    expected = group_expectation(
        task,
        gigpo_token_advantages,
        size,
        layout,
        normalize_std=False,
        step_key=step_key,
        step_weight=step_weight,
    )
    close(expected, weights * task.gradient())


# --- (b) hand-made batches ------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """A turn's generated tokens and its return-to-go G."""

    index: int
    ret: float
    tokens: tuple[int, ...]


Sample = tuple[int, int, list]  # (group, episode, segments): a list of ints is masked context


def inputs(samples: list[Sample]) -> dict[str, torch.Tensor]:
    width = max(
        sum(len(s.tokens) if isinstance(s, Turn) else len(s) for s in segs) for *_, segs in samples
    )
    n = len(samples)
    input_ids = torch.zeros(n, width, dtype=torch.long)
    turn_ids = torch.full((n, width), -1, dtype=torch.long)
    token_returns = torch.zeros(n, width, dtype=torch.float64)
    for i, (*_, segments) in enumerate(samples):
        at = 0
        for seg in segments:
            tokens = seg.tokens if isinstance(seg, Turn) else tuple(seg)
            input_ids[i, at : at + len(tokens)] = torch.tensor(tokens)
            if isinstance(seg, Turn):
                turn_ids[i, at : at + len(tokens)] = seg.index
                token_returns[i, at : at + len(tokens)] = seg.ret
            at += len(tokens)
    return {
        "rewards": torch.zeros(n),
        "group_ids": torch.tensor([s[0] for s in samples]),
        "episode_ids": torch.tensor([s[1] for s in samples]),
        "loss_mask": (turn_ids >= 0).to(torch.int64),
        "token_returns": token_returns,
        "turn_ids": turn_ids,
        "input_ids": input_ids,
    }


def place(samples: list[Sample], values: dict[tuple[int, int, int], float]) -> torch.Tensor:
    """``values[(group, episode, turn)]`` on that turn's tokens; 0 elsewhere."""
    batch = inputs(samples)
    out = torch.zeros(batch["turn_ids"].shape, dtype=torch.float64)
    for i, (group, episode, _) in enumerate(samples):
        for j, turn in enumerate(batch["turn_ids"][i].tolist()):
            if turn >= 0:
                out[i, j] = values[(group, episode, turn)]
    return out


def turn(**kw):
    return turn_token_advantages(**{k: v for k, v in kw.items() if k != "input_ids"})


# Task 7: episode 0 plays two turns in one sample; episode 1 plays three, turns 0–1 in one sample
# and turn 2 in another whose prompt holds the first two; episode 2 stops after one turn. Task 3 has
# a single episode.
MIXED: list[Sample] = [
    (7, 0, [[1, 50], Turn(0, 3.0, (10, 11)), [60], Turn(1, 1.0, (12,))]),
    (7, 1, [[1, 50], Turn(0, 2.0, (13,)), [60], Turn(1, 2.0, (14, 14))]),
    (7, 1, [[1, 50, 13, 60, 14, 14, 70], Turn(2, 1.0, (15,))]),
    (7, 2, [[1, 50], Turn(0, 0.0, (16,))]),
    (3, 0, [[2, 50], Turn(0, 5.0, (16,)), [61], Turn(1, 4.0, (17,))]),
]


def test_turn_advantages_by_hand() -> None:
    """Turn 0 of task 7: 3 vs (2+0)/2, 2 vs (3+0)/2, 0 vs (3+2)/2. Turn 1: 1 vs 2 and 2 vs 1. Turn 2
    and task 3 have no other episode: 0, or G itself with single_sample=reward."""
    common = {(7, 0, 0): 2.0, (7, 0, 1): -1.0, (7, 1, 0): 0.5, (7, 1, 1): 1.0, (7, 2, 0): -2.5}
    zero = {**common, (7, 1, 2): 0.0, (3, 0, 0): 0.0, (3, 0, 1): 0.0}
    reward = {**common, (7, 1, 2): 1.0, (3, 0, 0): 5.0, (3, 0, 1): 4.0}
    close(turn(**inputs(MIXED), single_sample="zero"), place(MIXED, zero))
    close(turn(**inputs(MIXED)), place(MIXED, reward))  # the default


def test_merged_and_split_layouts_give_the_same_turn_advantages() -> None:
    merged = [
        (7, 1, [[1, 50], Turn(0, 2.0, (13,)), [60], Turn(1, 2.0, (14,)), [70], Turn(2, 1.0, (15,))])
    ]
    split = [
        (7, 1, [[1, 50], Turn(0, 2.0, (13,))]),
        (7, 1, [[1, 50, 13, 60], Turn(1, 2.0, (14,))]),
        (7, 1, [[1, 50, 13, 60, 14, 70], Turn(2, 1.0, (15,))]),
    ]
    other = [
        (7, 0, [[1, 50], Turn(0, 3.0, (10,)), [60], Turn(1, 0.5, (12,)), [70], Turn(2, 0.0, (9,))])
    ]
    values = {
        (7, 1, 0): -1.0,
        (7, 1, 1): 1.5,
        (7, 1, 2): 1.0,
        (7, 0, 0): 1.0,
        (7, 0, 1): -1.5,
        (7, 0, 2): -1.0,
    }
    for layout in (merged, split):
        close(turn(**inputs(layout + other)), place(layout + other, values))


def test_masked_positions_stay_zero_whatever_they_hold() -> None:
    batch = inputs(MIXED)
    clean = turn(**batch)
    masked = batch["loss_mask"] == 0
    batch["token_returns"] = torch.where(masked, 99.0, batch["token_returns"])
    batch["turn_ids"] = torch.where(masked, 1, batch["turn_ids"])
    noisy = turn(**batch)
    close(noisy, clean)
    assert (noisy[masked] == 0).all()
    assert (gigpo_token_advantages(**batch)[masked] == 0).all()


def test_episode_ids_need_only_be_unique_within_a_group() -> None:
    """Episode 0 of task 1 and episode 0 of task 2 are two episodes."""
    samples: list[Sample] = [
        (1, 0, [[1], Turn(0, 1.0, (5,))]),
        (1, 1, [[1], Turn(0, 3.0, (5,))]),
        (2, 0, [[1], Turn(0, 10.0, (5,))]),
        (2, 1, [[1], Turn(0, 20.0, (5,))]),
    ]
    close(
        turn(**inputs(samples)),
        place(samples, {(1, 0, 0): -2.0, (1, 1, 0): 2.0, (2, 0, 0): -10.0, (2, 1, 0): 10.0}),
    )


def test_the_std_is_the_spread_of_the_other_episodes_returns() -> None:
    """Task 1: returns 1, 2, 4, 7 (the episode's return is G at its first turn); each advantage is
    divided by the stdev of the other three. Task 2 has two episodes: no spread to measure, no
    scale."""
    returns = [1.0, 2.0, 4.0, 7.0]
    samples: list[Sample] = [
        (1, e, [[1], Turn(0, g, (5,)), [6], Turn(1, g / 2, (5,))]) for e, g in enumerate(returns)
    ]
    samples += [(2, 0, [[1], Turn(0, 1.0, (5,))]), (2, 1, [[1], Turn(0, 4.0, (5,))])]
    eps = 1e-6
    values = {(2, 0, 0): -3.0, (2, 1, 0): 3.0}
    for e, g in enumerate(returns):
        others = returns[:e] + returns[e + 1 :]
        spread = statistics.stdev(others) + eps
        values[(1, e, 0)] = (g - statistics.mean(others)) / spread
        values[(1, e, 1)] = (g / 2 - statistics.mean(others) / 2) / spread
    close(turn(**inputs(samples), normalize_std=True, eps=eps), place(samples, values))


def test_others_that_all_agree_leave_the_episode_unscaled() -> None:
    """Returns 0.1, 0.1, 0.1, 1 (0.1 has no exact binary form): for the episode at 1 the others
    agree, so no std to divide by; for the others the spread is stdev(0.1, 0.1, 1) = 0.3·√3."""
    samples: list[Sample] = [
        (1, e, [[1], Turn(0, g, (5,))]) for e, g in enumerate([0.1, 0.1, 0.1, 1.0])
    ]
    spread = statistics.stdev([0.1, 0.1, 1.0])
    low = (0.1 - 0.4) / spread
    values = {(1, 0, 0): low, (1, 1, 0): low, (1, 2, 0): low, (1, 3, 0): 0.9}
    close(turn(**inputs(samples), normalize_std=True, eps=0.0), place(samples, values))


# GiGPO: three episodes of one task from one prompt. After turn 0, episodes 0 and 1 see the same
# observation (60) through different actions (10, 13); episode 2 sees 61.
ANCHORS: list[Sample] = [
    (7, 0, [[1, 50], Turn(0, 2.0, (10,)), [60], Turn(1, 1.0, (11,))]),
    (7, 1, [[1, 50], Turn(0, 0.0, (13,)), [60], Turn(1, 3.0, (11, 11))]),
    (7, 2, [[1, 50], Turn(0, 1.0, (10,)), [61], Turn(1, 1.0, (12,))]),
]


def test_gigpo_groups_steps_by_observation() -> None:
    """Episode level: returns 2, 0, 1 (mean 1) give 1, −1, 0. Step level: turn 0 starts from the
    shared prompt, so it repeats the episode level; turn 1 of episodes 0 and 1 share observation 60
    (G = 1 and 3, mean 2: −1 and +1); episode 2's turn 1 is alone (0). step_weight 0.5."""
    a = gigpo_token_advantages(**inputs(ANCHORS), normalize_std=False, step_weight=0.5)
    values = {
        (7, 0, 0): 1.5,
        (7, 0, 1): 0.5,
        (7, 1, 0): -1.5,
        (7, 1, 1): -0.5,
        (7, 2, 0): 0.0,
        (7, 2, 1): 0.0,
    }
    close(a, place(ANCHORS, values))


def test_gigpo_history_key_needs_the_whole_context_to_match() -> None:
    """By history, turn 1 of episodes 0 and 1 differ (actions 10 and 13 came before): no step
    group, only the episode level."""
    a = gigpo_token_advantages(
        **inputs(ANCHORS), normalize_std=False, step_weight=0.5, step_key="history"
    )
    values = {
        (7, 0, 0): 1.5,
        (7, 0, 1): 1.0,
        (7, 1, 0): -1.5,
        (7, 1, 1): -1.0,
        (7, 2, 0): 0.0,
        (7, 2, 1): 0.0,
    }
    close(a, place(ANCHORS, values))


def test_gigpo_normalises_both_levels_by_their_std() -> None:
    """Returns 2, 0, 1: stdev 1. Turn-1 step group G = 1, 3: stdev √2."""
    eps = 1e-6
    e = 1 / (1 + eps)
    s = 1 / (math.sqrt(2) + eps)
    a = gigpo_token_advantages(**inputs(ANCHORS), eps=eps)
    values = {
        (7, 0, 0): 2 * e,
        (7, 0, 1): e - s,
        (7, 1, 0): -2 * e,
        (7, 1, 1): -e + s,
        (7, 2, 0): 0.0,
        (7, 2, 1): 0.0,
    }
    close(a, place(ANCHORS, values))


def test_gigpo_a_revisited_state_joins_its_own_group() -> None:
    """Episode 0 sees observation 60 at turns 1 and 2, episode 1 at turn 1: one step group of three
    (G = 4, 2, 0; mean 2). Only the step level is looked at (episode level of equal returns: 0)."""
    samples: list[Sample] = [
        (7, 0, [[1], Turn(0, 4.0, (10,)), [60], Turn(1, 4.0, (11,)), [60], Turn(2, 2.0, (12,))]),
        (7, 1, [[1], Turn(0, 4.0, (13,)), [60], Turn(1, 0.0, (11,))]),
    ]
    a = gigpo_token_advantages(**inputs(samples), normalize_std=False)
    values = {(7, 0, 0): 0.0, (7, 0, 1): 2.0, (7, 0, 2): 0.0, (7, 1, 0): 0.0, (7, 1, 1): -2.0}
    close(a, place(samples, values))


def test_gigpo_never_groups_steps_across_tasks() -> None:
    """The same observation in two tasks makes two step groups: each of one step, so 0."""
    samples: list[Sample] = [
        (1, 0, [[1], Turn(0, 1.0, (10,)), [60], Turn(1, 1.0, (11,))]),
        (1, 1, [[1], Turn(0, 1.0, (10,)), [61], Turn(1, 1.0, (11,))]),
        (2, 0, [[2], Turn(0, 1.0, (10,)), [60], Turn(1, 5.0, (11,))]),
        (2, 1, [[2], Turn(0, 1.0, (10,)), [61], Turn(1, 7.0, (11,))]),
    ]
    a = gigpo_token_advantages(**inputs(samples), normalize_std=False)
    close(a, torch.zeros_like(a))


def test_gigpo_a_task_with_one_episode_follows_single_sample() -> None:
    samples: list[Sample] = [(3, 0, [[1], Turn(0, 5.0, (10,)), [60], Turn(1, 4.0, (11,))])]
    a = gigpo_token_advantages(**inputs(samples))
    close(a, torch.zeros_like(a))
    b = gigpo_token_advantages(**inputs(samples), single_sample="reward", eps=0.0)
    close(b, place(samples, {(3, 0, 0): 5.0, (3, 0, 1): 5.0}))


def test_gigpo_hashes_tell_apart_spans_that_differ_in_one_token_or_in_order() -> None:
    samples: list[Sample] = [
        (7, 0, [[1, 2, 3], Turn(0, 1.0, (10,))]),
        (7, 1, [[1, 3, 2], Turn(0, 2.0, (10,))]),
        (7, 2, [[1, 2, 4], Turn(0, 3.0, (10,))]),
        (7, 3, [[0, 1, 2, 3], Turn(0, 4.0, (10,))]),
        (7, 4, [[1, 2, 3], Turn(0, 5.0, (10,))]),
    ]
    a = gigpo_token_advantages(**inputs(samples), normalize_std=False, step_weight=1.0)
    episode = [g - 3.0 for g in (1.0, 2.0, 3.0, 4.0, 5.0)]
    step = [-2.0, 0.0, 0.0, 0.0, 2.0]  # only episodes 0 and 4 share [1, 2, 3]
    close(a, place(samples, {(7, e, 0): episode[e] + step[e] for e in range(5)}))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_the_output_has_the_returns_float_type(dtype: torch.dtype) -> None:
    batch = inputs(MIXED)
    reference = {"turn": turn(**batch), "gigpo": gigpo_token_advantages(**batch)}
    batch["token_returns"] = batch["token_returns"].to(dtype)
    for name, a in (("turn", turn(**batch)), ("gigpo", gigpo_token_advantages(**batch))):
        assert a.dtype == dtype
        close(a, reference[name].to(dtype), atol=0)


def test_integer_returns_become_the_default_float_type() -> None:
    batch = inputs(MIXED)
    reference = turn(**batch)
    batch["token_returns"] = batch["token_returns"].to(torch.int64)
    a = turn(**batch)
    assert a.dtype == torch.get_default_dtype()
    close(a, reference)


def test_returns_are_computed_in_float64() -> None:
    """Returns 2²⁴ and 2²⁴ + 2 are exact in float32, their mean 2²⁴ + 1 is not reachable through a
    float32 sum (2²⁵ + 2 rounds): float64 inside gives the exact ±1."""
    big = float(2**24)
    samples: list[Sample] = [
        (1, 0, [[1], Turn(0, big, (5,))]),
        (1, 1, [[1], Turn(0, big + 2, (5,))]),
    ]
    batch = inputs(samples)
    batch["token_returns"] = batch["token_returns"].to(torch.float32)
    a = gigpo_token_advantages(**batch, normalize_std=False, step_weight=0.0)
    close(a, place(samples, {(1, 0, 0): -1.0, (1, 1, 0): 1.0}), atol=0)


def test_an_empty_batch_gives_an_empty_answer() -> None:
    batch = {k: v[:, :0] if v.dim() == 2 else v for k, v in inputs(MIXED).items()}
    assert turn(**batch).shape == (5, 0)
    assert gigpo_token_advantages(**batch).shape == (5, 0)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda b: b["turn_ids"].__setitem__((0, 2), -1), "needs its turn"),
        (lambda b: b["token_returns"].__setitem__((0, 3), 7.0), "one value per turn"),
        (lambda b: b.__setitem__("episode_ids", b["episode_ids"][:2]), "episode_ids must be"),
        (lambda b: b.__setitem__("turn_ids", b["turn_ids"][:, :3]), "expected"),
    ],
)
def test_malformed_inputs_are_refused(change, message: str) -> None:
    batch = inputs(MIXED)
    change(batch)
    with pytest.raises(ValueError, match=message):
        turn(**batch)
    with pytest.raises(ValueError, match=message):
        gigpo_token_advantages(**batch)


def test_gigpo_refuses_an_unknown_key_and_a_turn_split_over_samples() -> None:
    with pytest.raises(ValueError, match="step_key"):
        gigpo_token_advantages(**inputs(MIXED), step_key="state")
    with pytest.raises(ValueError, match="single_sample"):
        turn(**inputs(MIXED), single_sample="mean")
    torn: list[Sample] = [
        (7, 0, [[1], Turn(0, 1.0, (10,))]),
        (7, 0, [[1, 10], Turn(0, 1.0, (11,))]),
    ]
    with pytest.raises(ValueError, match="one sample"):
        gigpo_token_advantages(**inputs(torn))
    # The turn estimator has no anchor to read: one episode, nothing to compare with.
    close(turn(**inputs(torn), single_sample="zero"), torch.zeros(2, 3))


# --- (c) single-turn episodes: RLOO and GRPO ------------------------------------------------------


@st.composite
def single_turn_batches(draw) -> dict[str, torch.Tensor]:
    """One sample per episode, one turn each, no per-turn rewards: G = the sequence reward on every
    generated token. Groups of 1 to 4, prompts and answers of random lengths."""
    n = draw(st.integers(1, 10))
    groups = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    rewards = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, -2.0, 3.25]), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    answers = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    samples: list[Sample] = [
        (g, e, [[1] * p, Turn(0, r, (9,) * a)])
        for e, (g, r, p, a) in enumerate(zip(groups, rewards, prompts, answers))
    ]
    batch = inputs(samples)
    batch["rewards"] = torch.tensor(rewards, dtype=torch.float64)
    return batch


SINGLE_TURN = settings(settings.get_profile("areal-fuzz"), max_examples=150)


@SINGLE_TURN
@given(single_turn_batches(), st.sampled_from(["zero", "reward"]))
def test_one_turn_per_episode_turn_advantages_are_rloo(batch, single_sample: str) -> None:
    expected = rloo_token_advantages(
        rewards=batch["rewards"],
        group_ids=batch["group_ids"],
        loss_mask=batch["loss_mask"],
        single_sample=single_sample,
    )
    close(turn(**batch, single_sample=single_sample), expected)


@SINGLE_TURN
@given(
    single_turn_batches(),
    st.sampled_from(["zero", "reward"]),
    st.booleans(),
    st.sampled_from(["observation", "history"]),
)
def test_gigpo_without_its_step_level_is_grpo(
    batch, single_sample: str, normalize_std: bool, step_key: str
) -> None:
    options = {"single_sample": single_sample, "normalize_std": normalize_std, "eps": 1e-6}
    expected = grpo_token_advantages(
        rewards=batch["rewards"],
        group_ids=batch["group_ids"],
        loss_mask=batch["loss_mask"],
        **options,
    )
    close(gigpo_token_advantages(**batch, step_weight=0.0, step_key=step_key, **options), expected)
