"""The ``calculator`` task of ``make demo``: its environment and reward by hand, demonstrations
that show every style, its openai-SDK agent playing for real through a gateway, and the key
reward (``dataset.options``) reaching turn 1 or the episode as asked."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest

from areal.core.config import ConfigError
from areal.core.tasks import TaskStream, configured, task_set
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


# --- the key reward ------------------------------------------------------------------------------


def test_key_reward_options_travel_in_the_tasks() -> None:
    plain = task_set("calculator")
    turn = configured(plain, {"key_reward": 0.5})
    episode = configured(plain, {"key_reward": 0.25, "key_reward_to": "episode"})
    assert turn.task(3, 0) == {**plain.task(3, 0), "key_reward": 0.5, "key_reward_to": "turn"}
    assert episode.task(3, 0)["key_reward_to"] == "episode"
    assert configured(plain, {"key_reward": 0}).task(3, 0) == plain.task(3, 0) == calc.task(3, 0)
    assert (turn.agent, turn.success_reward) == (plain.agent, plain.success_reward)


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"key_reward": -0.1}, "key_reward"),
        ({"key_reward": 1.0}, "key_reward"),  # as much as the answer: success would be ambiguous
        ({"key_reward": math.nan}, "key_reward"),
        ({"key_reward": "0.5"}, "key_reward"),
        ({"key_reward": True}, "key_reward"),
        ({"key_reward": 0.5, "key_reward_to": "both"}, "key_reward_to"),
        ({"key_rewards": 0.5}, "key_rewards"),
    ],
)
def test_a_bad_key_reward_option_names_its_key(options: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^dataset\.options\.{key}: "):
        configured(task_set("calculator"), options)


def test_the_key_reward_reaches_turn_1_or_the_episode(
    serve: Any, warm_calculator_dir: Path, tmp_path: Path
) -> None:
    """Episodes played for real by the warm-started nano model at temperature 1: those whose turn
    1 said ``square`` (decoded from the recorded tokens) and only those get the key reward, as
    turn 1's reward (its return 0.5 + R, turn 2's R) or in the episode's reward (0.25 + R),
    and the reward the success rule reads is the answer's alone in turn mode."""
    from transformers import AutoTokenizer

    per_mode = 96  # P(no "square" among them) ~ (1 - 1/7)^96 < 1e-6
    plain = task_set("calculator")
    turn = configured(plain, {"key_reward": 0.5})
    episode = configured(plain, {"key_reward": 0.25, "key_reward_to": "episode"})
    tasks = [{**turn.task(i, 0), "task_index": i} for i in range(per_mode)]
    tasks += [{**episode.task(i, 0), "task_index": i} for i in range(per_mode, 2 * per_mode)]
    with serve(warm_calculator_dir, tmp_path, temperature=1.0) as served:
        worker = RolloutWorker(served.url, served.admin, calc.agent, model=served.model)
        stats = asyncio.run(worker.run(tasks))
        lines = (tmp_path / "trajectories.jsonl").read_text().splitlines()
    assert (stats.finished, stats.failed, stats.timed_out) == (2 * per_mode, 0, 0)
    tokenizer = AutoTokenizer.from_pretrained(warm_calculator_dir)
    pressed = {"turn": 0, "episode": 0}
    for line in lines:
        t = Trajectory.from_json(json.loads(line))
        mode = tasks[t.metadata["task_index"]]["key_reward_to"]
        first, second = t.turns
        request = tokenizer.decode(first.output_ids, skip_special_tokens=True).strip()
        right_key = request == calc.RIGHT_KEY
        pressed[mode] += right_key
        assert t.reward is not None
        answer = t.reward if mode == "turn" else t.reward - 0.25 * right_key
        assert answer in (0.0, 1.0), (request, t.reward)
        # the step's success rule (reward >= 1) counts right answers only, in either mode
        assert (t.reward >= calc.SUCCESS_REWARD) == (answer == 1.0)
        spans = [span for sample in t.samples for span in sample.turns]  # merged or not
        if mode == "turn":
            assert first.reward == (0.5 if right_key else None), request
            assert [s.ret for s in spans] == [0.5 * right_key + answer, answer]
        else:
            assert first.reward is None and second.reward is None
            assert [s.ret for s in spans] == [t.reward, t.reward]
    assert pressed["turn"] > 0 and pressed["episode"] > 0, pressed
