"""The ``calculator`` task of ``make demo``: its environment and reward by hand, demonstrations
that show every style, and its openai-SDK agent playing for real through a gateway."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from areal.core.tasks import TaskStream, task_set
from areal.core.types import Trajectory
from areal.plugins.tasks import calculator as calc
from areal.run.rollout import RolloutWorker


def test_tasks_are_deterministic_and_registered() -> None:
    assert calc.task(3, 0) == calc.task(3, 0)
    t = calc.task(3, 0)
    assert t["question"] == f"What is {t['n']} squared?" and t["answer"] == str(t["n"] ** 2)
    assert {calc.task(i, 0)["n"] for i in range(200)} == set(range(calc.SMALLEST, 10))
    assert task_set("calculator").agent == "areal.plugins.tasks.calculator:agent"


@pytest.mark.parametrize(
    ("request_text", "expected"),
    [
        ("square 7", "= 49"),
        (" square 12 ", "= 144"),
        ("7^2", "= 7"),  # not understood: read as its first number
        ("compute 3 times 3", "= 3"),
        ("square", calc.UNKNOWN),
        ("hello", calc.UNKNOWN),
    ],
)
def test_the_calculator_squares_only_on_square(request_text: str, expected: str) -> None:
    assert calc.calculate(request_text) == expected


@pytest.mark.parametrize(
    ("request_text", "reply", "expected"),
    [
        ("square 3", "9", 1.0),  # the right number, bare
        ("square 3", " 9 ", 1.0),
        ("square 3", "It is 9.", 0.0),  # right, but not what the grader reads
        ("square 4", "16", 0.0),  # the calculator's answer to the wrong question
        ("pow 3 2", "3", 0.0),  # the calculator's misreading, copied
        ("pow 3 2", "9", 1.0),  # right without the calculator is still right
        ("square 3", None, 0.0),
    ],
)
def test_only_the_right_answer_earns(request_text: str, reply: str | None, expected: float) -> None:
    task = {**calc.task(0, 0), "n": 3, "answer": "9"}
    assert calc.score(task, request_text, reply).total == pytest.approx(expected)
    assert (expected >= calc.SUCCESS_REWARD) == (expected == 1.0)
    assert task_set("calculator").success_reward == calc.SUCCESS_REWARD


def test_demonstrations_show_the_format_but_rarely_a_graded_answer() -> None:
    """Every style appears, each request is about the question's number, the calculator's true
    answer follows and the reply repeats it; only the styles that happen to be the calculator's
    and the grader's make an episode a right one (about 1 in 48)."""
    tasks = [calc.task(i, 0) for i in range(960)]
    demos = [calc.demonstration(i, 0)["messages"] for i in range(960)]
    for style in calc.REQUEST_STYLES:
        assert any(_matches(style, m[1]["content"]) for m in demos), style
    for t, m in zip(tasks, demos, strict=True):
        assert m[0]["content"] == t["question"]
        assert any(style.format(n=t["n"]) == m[1]["content"] for style in calc.REQUEST_STYLES)
        assert m[2]["content"] == calc.calculate(m[1]["content"])  # the environment's answer
        assert m[2]["content"].removeprefix("= ") in m[3]["content"]  # repeated in the reply
    right = sum(calc.score(t, m[1]["content"], m[3]["content"]).total for t, m in zip(tasks, demos))
    assert 960 / 48 / 2 < right < 960 / 48 * 2


def _matches(style: str, text: str) -> bool:
    return any(style.format(n=n) == text for n in range(10))


def test_the_agent_plays_two_calls_through_the_gateway(
    serve: Any, nano_dir: Path, tmp_path: Path
) -> None:
    stream = TaskStream(path=None, name="calculator", seed=0)
    with serve(nano_dir, tmp_path, temperature=1.0) as served:
        worker = RolloutWorker(served.url, served.admin, calc.agent, model=served.model)
        stats = asyncio.run(worker.run([stream[i] for i in range(6)]))
        lines = (tmp_path / "trajectories.jsonl").read_text().splitlines()
    assert (stats.finished, stats.failed, stats.timed_out) == (6, 0, 0)
    trajectories = [Trajectory.from_json(json.loads(line)) for line in lines]
    assert len(trajectories) == 6
    assert all(t.completions == 2 for t in trajectories)  # the calculator answers every request
    assert all(0.0 <= r <= 1.0 for r in stats.rewards)
