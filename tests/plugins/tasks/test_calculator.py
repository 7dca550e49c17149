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
    found = task_set("calculator")
    assert found.agent == "areal.plugins.tasks.calculator:agent"
    assert found.success_reward == calc.SUCCESS_REWARD == 1.0


@pytest.mark.parametrize(
    ("request_text", "expected"),
    [
        ("square", "= 49"),
        (" square ", "= 49"),
        ("double", "= 14"),
        ("cube", "= 343"),
        ("negate", "= -7"),
        ("triangle", "= 28"),
        ("square 7", calc.UNKNOWN),
        ("", calc.UNKNOWN),
    ],
)
def test_the_calculator_presses_the_named_key(request_text: str, expected: str) -> None:
    assert calc.calculate(request_text, 7) == expected


def test_only_square_gives_the_square_of_any_question() -> None:
    """So a wrong key always means a wrong answer: no key answers right by coincidence."""
    for n in range(calc.SMALLEST, 10):
        displays = [calc.calculate(key, n) for key in calc.KEYS]
        assert displays.count(f"= {n * n}") == 1, (n, displays)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("49", 1.0),  # the right number, bare
        (" 49 ", 1.0),
        ("It is 49.", 0.0),  # right, but not what the grader reads
        ("14", 0.0),  # the display after the wrong key, repeated
        ("7", 0.0),
        (None, 0.0),
    ],
)
def test_only_the_right_answer_earns(reply: str | None, expected: float) -> None:
    task = {**calc.task(0, 0), "n": 7, "answer": "49"}
    assert calc.score(task, "square", reply).total == pytest.approx(expected)


def test_demonstrations_show_the_format_but_rarely_a_graded_answer() -> None:
    """Every key and reply style appears; the calculator's true display follows each key and the
    reply repeats it; only the key that squares with the bare style makes a right answer, about
    one demonstration in 48."""
    tasks = [calc.task(i, 0) for i in range(960)]
    demos = [calc.demonstration(i, 0)["messages"] for i in range(960)]
    assert {m[1]["content"] for m in demos} == set(calc.KEYS)
    for t, m in zip(tasks, demos, strict=True):
        assert m[0]["content"] == t["question"]
        assert m[2]["content"] == calc.calculate(m[1]["content"], t["n"])
        assert m[3]["content"] in {s.format(r=m[2]["content"][2:]) for s in calc.REPLY_STYLES}
    right = sum(calc.score(t, m[1]["content"], m[3]["content"]).total for t, m in zip(tasks, demos))
    assert 960 / 48 / 2 < right < 960 / 48 * 2


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
