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
    assert {calc.task(i, 0)["n"] for i in range(200)} == set(range(10))
    assert task_set("calculator").agent == "areal.plugins.tasks.calculator:agent"


@pytest.mark.parametrize(
    ("request_text", "expected"),
    [
        ("square 7", "= 49"),
        (" square 12 ", "= 144"),
        ("7^2", calc.UNKNOWN),
        ("square", calc.UNKNOWN),
    ],
)
def test_the_calculator_understands_only_square(request_text: str, expected: str) -> None:
    assert calc.calculate(request_text) == expected


@pytest.mark.parametrize(
    ("request_text", "reply", "expected"),
    [
        ("square 3", "9", 1.0),  # understood, bare number (any number: the value is not graded)
        ("square 3", "It is 9.", 0.6),
        ("pow 3 2", "9", 0.4),
        ("pow 3 2", "The answer is 9", 0.0),
        ("square 3", None, 0.6),
    ],
)
def test_reward_by_hand(request_text: str, reply: str | None, expected: float) -> None:
    assert calc.score(calc.task(0, 0), request_text, reply).total == pytest.approx(expected)


def test_demonstrations_show_every_style_with_random_numbers() -> None:
    demos = [calc.demonstration(i, 0)["messages"] for i in range(400)]
    requests = {m[1]["content"] for m in demos}
    for style in calc.REQUEST_STYLES:
        assert any(_matches(style, r) for r in requests), style
    for m in demos:
        assert m[2]["content"] == calc.calculate(m[1]["content"])  # the environment's true answer
    # Format only: the demonstrated number is not the question's more often than chance.
    copied = sum(str(calc.task(i, 0)["n"]) in demos[i][1]["content"] for i in range(400))
    assert copied < 0.25 * 400


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
