"""Completions -> samples: token-for-token merging, loss masks, versions, discounted rewards."""

from __future__ import annotations

import json

import numpy as np
import pytest

from areal.core.trajectory import (
    build_trajectory,
    discounted_returns,
    extends,
    merge_completions,
)
from areal.core.types import Completion, Sample, Trajectory


def completion(
    turn: int,
    prompt: list[int],
    output: list[int],
    *,
    version: int = 0,
    reward: float | None = None,
) -> Completion:
    return Completion(
        completion_id=f"c{turn}",
        session_id="s",
        turn=turn,
        model="policy",
        prompt_ids=prompt,
        output_ids=output,
        output_logprobs=[-(turn + 1) / 10 - i / 100 for i in range(len(output))],
        output_versions=[version] * len(output),
        finish_reason="stop",
        reward=reward,
    )


def four_turns(**rewards: float) -> list[Completion]:
    return [
        completion(0, [1, 2, 3], [4, 5], reward=rewards.get("c0")),
        completion(1, [1, 2, 3, 4, 5, 6, 7], [8], version=1, reward=rewards.get("c1")),
        completion(
            2, [1, 2, 9], [10, 11], version=1, reward=rewards.get("c2")
        ),  # history rewritten
        completion(
            3, [1, 2, 9, 10, 11], [12], version=2, reward=rewards.get("c3")
        ),  # no new context
    ]


def test_extends() -> None:
    assert extends([1, 2], [1, 2, 3]) and extends([1, 2], [1, 2]) and extends([], [7])
    assert not extends([1, 2, 3], [1, 2]) and not extends([1, 2], [1, 3, 2])


def test_turns_that_extend_merge_and_others_start_a_sample() -> None:
    first, second = merge_completions(four_turns())
    assert first.input_ids.tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert first.loss_mask.tolist() == [0, 0, 0, 1, 1, 0, 0, 1]
    # Held as float32, the queue's wire type: the engine's values rounded once, on the gateway.
    assert (
        first.logprobs.tolist() == np.float32([0.0, 0.0, 0.0, -0.1, -0.11, 0.0, 0.0, -0.2]).tolist()
    )
    assert first.versions.tolist() == [-1, -1, -1, 0, 0, -1, -1, 1]
    assert first.completion_ids == ["c0", "c1"] and first.min_version == 0
    assert second.input_ids.tolist() == [1, 2, 9, 10, 11, 12]
    assert second.loss_mask.tolist() == [0, 0, 0, 1, 1, 1]
    assert second.versions.tolist() == [-1, -1, -1, 1, 1, 2]
    assert second.completion_ids == ["c2", "c3"] and second.min_version == 1


def test_turn_order_not_arrival_order_decides() -> None:
    turns = four_turns()
    shuffled = [turns[2], turns[0], turns[3], turns[1]]
    assert merge_completions(shuffled) == merge_completions(turns)


def test_a_re_tokenized_or_shortened_history_is_a_new_sample() -> None:
    retokenized = [completion(0, [1, 2], [3, 4]), completion(1, [1, 2, 3, 5, 6], [7])]
    assert len(merge_completions(retokenized)) == 2
    truncated = [completion(0, [1, 2, 3], [4]), completion(1, [1, 2], [5])]
    assert [s.input_ids.tolist() for s in merge_completions(truncated)] == [[1, 2, 3, 4], [1, 2, 5]]


def test_mismatched_lengths_are_refused() -> None:
    bad = completion(0, [1], [2, 3])
    bad.output_versions = [0]
    with pytest.raises(ValueError, match="2 output ids but 2 logprobs and 1 versions"):
        merge_completions([bad])


def test_episode_reward_is_discounted_back_per_turn() -> None:
    assert discounted_returns([0.0, 0.0, 0.0], 2.0, 0.9) == pytest.approx([1.62, 1.8, 2.0])
    traj = build_trajectory("s", four_turns(), episode_reward=1.0, discount=0.5)
    # Four turns, two per sample: one discount per turn, merged or not.
    assert [[s.ret for s in x.turns] for x in traj.samples] == [[0.125, 0.25], [0.5, 1.0]]
    assert [s.reward for s in traj.samples] == [0.125, 0.5]  # each sample's first turn
    assert traj.reward == 1.0 and traj.completions == 4
    flat = build_trajectory("s", four_turns(), episode_reward=1.0)
    assert [s.reward for s in flat.samples] == [1.0, 1.0]


def test_turn_rewards_add_to_the_return() -> None:
    # G3 = R = 1; G2 = -0.4 + 0.5 * 1 = 0.1; G1 = 0.2 + 0.5 * 0.1 = 0.25; G0 = 0.2 + 0.125.
    traj = build_trajectory(
        "s", four_turns(c0=0.2, c1=0.2, c2=-0.4), episode_reward=1.0, discount=0.5
    )
    returns = [[s.ret for s in x.turns] for x in traj.samples]
    assert returns == [pytest.approx([0.325, 0.25]), pytest.approx([0.1, 1.0])]
    assert [s.reward for s in traj.samples] == pytest.approx([0.325, 0.1])
    assert [t.reward for t in traj.turns] == [0.2, 0.2, -0.4, None]


def test_no_reward_at_all() -> None:
    traj = build_trajectory("s", four_turns(), episode_reward=None, discount=0.9)
    assert traj.reward is None and [s.reward for s in traj.samples] == [0.0, 0.0]
    assert build_trajectory("s", [], episode_reward=1.0).samples == []


def test_bad_discount_is_refused() -> None:
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="discount"):
            build_trajectory("s", four_turns(), episode_reward=1.0, discount=bad)


def test_trajectory_survives_json() -> None:
    traj = build_trajectory(
        "s", four_turns(c1=0.5), episode_reward=1.0, discount=0.5, metadata={"task_id": "t1"}
    )
    back = Trajectory.from_json(json.loads(json.dumps(traj.to_json())))
    assert back == traj and back.turns[1].reward == 0.5 and back.metadata == {"task_id": "t1"}


def test_each_turn_credits_its_own_tokens_in_a_merged_sample() -> None:
    traj = build_trajectory("s", four_turns(c0=1.0), episode_reward=0.0, discount=1.0)
    first, second = traj.samples
    # Sample 0 is [1 2 3 | 4 5 | 6 7 | 8]: turn 0's output at 3-5, turn 1's at 7.
    assert [(t.turn, t.start, t.end) for t in first.turns] == [(0, 3, 5), (1, 7, 8)]
    assert first.token_returns().tolist() == [0, 0, 0, 1, 1, 0, 0, 0]  # turn 1's return is 0
    assert first.token_turns().tolist() == [-1, -1, -1, 0, 0, -1, -1, 1]
    assert [t.turn for t in second.turns] == [2, 3]  # turns count across the episode's samples


def test_a_sample_without_spans_is_one_turn_worth_its_reward() -> None:
    sample = Sample([1, 2, 3], [0, 1, 1], [0, -1, -1], [-1, 0, 0], reward=0.5)
    assert sample.token_returns().tolist() == [0, 0.5, 0.5]
    assert sample.token_turns().tolist() == [-1, 0, 0]


def test_turn_spans_are_checked() -> None:
    for bad in ([[0, 0, 4, 1.0]], [[1, 0, 1, 0.0], [1, 1, 2, 0.0]], [[0, 2, 1, 0.0]]):
        with pytest.raises(ValueError, match="turn spans"):
            Sample([1, 2, 3], [0, 1, 1], [0, -1, -1], [-1, 0, 0], turns=bad)
