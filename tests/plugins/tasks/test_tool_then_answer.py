"""The ``tool_then_answer`` task set: deterministic tasks, a hand-checked reward, format-only
demonstrations, and its openai-SDK agent run for real through the gateway and the engine."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from areal.core.tasks import TaskStream, task_set
from areal.core.types import Trajectory
from areal.plugins.tasks.tool_then_answer import (
    ADD_TOOL,
    Score,
    agent,
    demonstration,
    run_tool,
    score,
    task,
)
from areal.plugins.tool_parsers.hermes import parse_call
from areal.run.rollout import RolloutWorker

TASK = {"task_id": "t", "question": "What is 3 plus 5?", "a": 3, "b": 5, "answer": "8"}


def args(a: Any, b: Any) -> str:
    return json.dumps({"a": a, "b": b})


# --- tasks ---------------------------------------------------------------------------------------


def test_tasks_are_deterministic_single_digit_sums() -> None:
    tasks = [task(i, 0) for i in range(200)]
    assert tasks == [task(i, 0) for i in range(200)]
    assert [task(i, 1) for i in range(20)] != tasks[:20]
    assert len({t["task_id"] for t in tasks}) == 200
    for t in tasks:
        assert 0 <= t["a"] <= 9 and 0 <= t["b"] <= 9
        assert t["question"] == f"What is {t['a']} plus {t['b']}?"
        assert t["answer"] == str(t["a"] + t["b"])
    assert {t["a"] for t in tasks} == set(range(10))  # every digit occurs


def test_the_task_set_is_registered_with_its_agent() -> None:
    found = task_set("tool_then_answer")
    assert found.task is task and found.demonstration is demonstration
    assert found.agent == "areal.plugins.tasks.tool_then_answer:agent"


def test_each_operand_and_each_sum_digit_is_one_token(nano_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(nano_dir)
    pieces = [tokenizer.decode([i]) for i in tokenizer.encode("What is 3 plus 5?")]
    assert "3" in pieces and "5" in pieces
    assert [tokenizer.decode([i]) for i in tokenizer.encode("18")] == ["1", "8"]


# --- the reward ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "answer", "expected"),
    [
        (("add", args(3, 5)), "8", 1.0),  # perfect
        (("add", args(7, 2)), "9", 0.2),  # format only: random arguments, their result
        (("add", args(3, 1)), "4", 0.4),  # one argument copied
        (("add", args(1, 5)), "6", 0.4),
        (("add", args(3, 5)), "9", 0.6),  # right call, wrong answer
        (("add", args(5, 3)), "8", 0.6),  # swapped arguments: the sum is right, the copy is not
        (("add", args(3, 5)), None, 0.6),  # no final answer
        (None, "8", 0.4),  # answered without the tool
        (None, None, 0.0),
        (("add", args(3, 5)), " 8\n", 1.0),  # surrounding whitespace is fine
        (("add", args(3, 5)), "8.", 0.6),  # anything else is not
        (("add", args(3, 5)), "The answer is 8", 0.6),
        (("sub", args(3, 5)), "8", 0.4),  # the wrong tool
        (("add", '{"a": 3, "b": 5'), "8", 0.4),  # arguments that are not JSON
        (("add", args("3", 5)), "8", 0.4),  # not integers
        (("add", args(True, 5)), "8", 0.4),
        (("add", args(3.0, 5)), "8", 0.4),
        (("add", '{"a": 3, "b": 5, "c": 0}'), "8", 0.4),  # an unknown argument
        (("add", '{"a": 3}'), "8", 0.4),
        (("add", "[3, 5]"), "8", 0.4),
    ],
)
def test_reward_by_hand(call: tuple[str, str] | None, answer: str | None, expected: float) -> None:
    assert score(TASK, call, answer).total == expected


def test_reward_parts() -> None:
    assert score(TASK, ("add", args(3, 0)), "3") == Score(call=0.2, a=0.2, b=0.0, answer=0.0)
    assert score(TASK, ("add", args(0, 5)), "8") == Score(call=0.2, a=0.0, b=0.2, answer=0.4)


def test_the_tool_answers_bad_calls_with_an_error_message() -> None:
    assert run_tool("add", args(4, 9)) == "13"
    assert run_tool("add", '{"a": "4", "b": 9}') == "error: add takes two integers, a and b"
    assert run_tool("add", "not json") == "error: add takes two integers, a and b"
    assert run_tool("mul", args(4, 9)).startswith("error: there is no tool named 'mul'")


# --- demonstrations ------------------------------------------------------------------------------


def test_demonstrations_show_the_format_with_random_arguments() -> None:
    copied = 0
    for i in range(300):
        demo = demonstration(i, 0)
        assert demo == demonstration(i, 0)
        assert demo["tools"] == [ADD_TOOL]
        user, call_turn, tool, answer = demo["messages"]
        assert [m["role"] for m in demo["messages"]] == ["user", "assistant", "tool", "assistant"]
        assert user["content"] == task(i, 0)["question"]
        (call,) = call_turn["tool_calls"]
        assert call["function"]["name"] == "add"
        x, y = json.loads(call["function"]["arguments"]).values()
        assert tool == {"role": "tool", "tool_call_id": call["id"], "content": str(x + y)}
        assert answer == {"role": "assistant", "content": str(x + y)}
        copied += (x, y) == (task(i, 0)["a"], task(i, 0)["b"])
    assert copied < 10  # chance (1 in 100), not copying


def test_demonstrated_calls_read_back_as_the_gateway_would_send_them() -> None:
    """The gateway re-serialises a parsed call's arguments; a call learned from the
    demonstrations must come back in the very same text, or the two turns could not merge."""
    call = demonstration(3, 0)["messages"][1]["tool_calls"][0]["function"]
    body = json.dumps({"name": "add", "arguments": json.loads(call["arguments"])})
    parsed = parse_call(body)
    assert parsed is not None and parsed.arguments == call["arguments"]


# --- the agent, for real -------------------------------------------------------------------------


def play_all(served: Any, episodes: int, seed: int) -> tuple[Any, list[Trajectory]]:
    stream = TaskStream(path=None, name="tool_then_answer", seed=seed)
    worker = RolloutWorker(served.url, served.admin, agent, model=served.model, concurrency=8)
    stats = asyncio.run(worker.run([stream[i] for i in range(episodes)]))
    lines = (served.log_dir / "trajectories.jsonl").read_text().splitlines()
    return stats, [Trajectory.from_json(json.loads(line)) for line in lines]


def test_a_warm_started_model_plays_two_calls_that_merge_into_one_sample(
    serve: Any, warm_nano_dir: Path, tmp_path: Path
) -> None:
    with serve(warm_nano_dir, tmp_path, temperature=0.0) as served:
        stats, trajectories = play_all(served, episodes=6, seed=11)
    assert (stats.finished, stats.failed, stats.timed_out) == (6, 0, 0)
    assert all(0.2 <= r <= 1.0 for r in stats.rewards)  # every episode made a valid call
    assert len(trajectories) == 6
    for t in trajectories:
        assert t.completions == 2
        first, second = sorted(t.turns, key=lambda c: c.turn)
        # Turn 2's prompt is turn 1's prompt and output, then the tool's turn: one sequence.
        assert second.prompt_ids[: len(first.prompt_ids)] == first.prompt_ids
        assert len(t.samples) == 1
        sample = t.samples[0]
        assert sample.input_ids.tolist() == second.prompt_ids + second.output_ids
        assert sample.generated_tokens == len(first.output_ids) + len(second.output_ids)
        assert sample.reward == t.reward


def test_the_agent_survives_an_untrained_model(serve: Any, nano_dir: Path, tmp_path: Path) -> None:
    with serve(nano_dir, tmp_path, temperature=1.0) as served:
        stats, trajectories = play_all(served, episodes=8, seed=0)
    assert (stats.finished, stats.failed, stats.timed_out) == (8, 0, 0)
    assert all(0.0 <= r <= 1.0 for r in stats.rewards)
    assert len(trajectories) == 8
