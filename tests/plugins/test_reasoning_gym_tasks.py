"""The ``reasoning_gym`` task set: reasoning-gym's own generators and scorers behind
``dataset.options``, items that two seeds never share, rewards only for a right answer, and the
held-out evaluation ``make demo-real`` reports (transformers' greedy replies, scored)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import reasoning_gym

from areal.core.config import ConfigError
from areal.core.tasks import TaskStream
from areal.plugins.tasks.reasoning_gym_tasks import read_answer, score

ARITHMETIC = {
    "tasks": ["basic_arithmetic"],
    "config": {"basic_arithmetic": {"min_terms": 2, "max_terms": 2, "operators": ["+", "-"]}},
    "size": 50,
}


def stream(options: dict[str, object], seed: int = 0) -> TaskStream:
    return TaskStream(path=None, name="reasoning_gym", seed=seed, options=options)


def test_items_are_reasoning_gyms_own_and_the_same_on_every_call() -> None:
    tasks = stream(ARITHMETIC)
    first = [tasks[i] for i in range(60)]  # past one pass of 50: the next pass, fresh items
    assert first == [stream(ARITHMETIC)[i] for i in range(60)]
    dataset = reasoning_gym.create_dataset(
        "basic_arithmetic", size=50, seed=0, min_terms=2, max_terms=2, operators=("+", "-")
    )
    assert [t["question"] for t in first[:50]] == [e["question"] for e in dataset]
    for task in first:
        assert (
            task["answer"] == str(task["entry"]["answer"]) and task["answer_rule"] == "last_number"
        )


def test_two_seeds_share_no_item() -> None:
    settings = {"min_terms": 2, "max_terms": 2, "operators": ("+", "-")}
    zero = reasoning_gym.create_dataset("basic_arithmetic", size=41, seed=0, **settings)
    one = reasoning_gym.create_dataset("basic_arithmetic", size=40, seed=1, **settings)
    # the trap: reasoning-gym draws item i of seed s from Random(s + i), so its seed 1 is seed 0
    # shifted by one item
    assert [one[i]["question"] for i in range(40)] == [zero[i + 1]["question"] for i in range(40)]
    options = {**ARITHMETIC, "size": 1000}
    train = {stream(options, seed=0)[i]["question"] for i in range(200)}
    held = [stream(options, seed=1)[i]["question"] for i in range(200)]
    # a few questions may coincide by chance (about 10^4 of them); a shift would share them all
    assert sum(question in train for question in held) < 20


def test_several_generators_take_turns() -> None:
    tasks = stream({"tasks": ["products", "chain_sum"], "size": 10})
    assert [tasks[i]["generator"] for i in range(4)] == ["products", "chain_sum"] * 2


def test_the_reward_is_the_scorers_for_the_answer_the_reply_gives() -> None:
    task = stream(ARITHMETIC)[0]
    right = task["answer"]
    assert score(task, f"The answer is {right}.") == 1.0
    assert score(task, f"{right}") == 1.0
    assert score(task, "I do not know.") == 0.0
    wrong = f"1{right.lstrip('-')}"  # contains the right digits: reasoning-gym pays part of it
    generator = reasoning_gym.create_dataset("basic_arithmetic", size=1, seed=0)
    assert 0 < generator.score_answer(wrong, task["entry"]) < 1 or right.startswith("-")
    assert score(task, f"It is {wrong}") == 0.0  # not paid unless partial_credit
    partial = stream({**ARITHMETIC, "partial_credit": True})[0]
    assert score(partial, f"It is {wrong}") == generator.score_answer(wrong, task["entry"])


def test_the_answer_is_read_from_a_sentence() -> None:
    assert read_answer("So 12 + 30 = 42.", "last_number") == "42"
    assert read_answer("It is -7", "last_number") == "-7"
    assert read_answer("1,234 apples", "last_number") == "1234"
    assert read_answer("no number", "last_number") == ""
    assert read_answer("  cat \n", "full") == "cat"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tasks": ["no_such_generator"]}, "dataset.options.tasks: reasoning-gym has no generator"),
        ({"tasks": []}, "dataset.options.tasks: name at least one"),
        ({"size": 0}, "dataset.options.size"),
        ({"answer": "first_word"}, "dataset.options.answer: one of last_number, full"),
        ({"partial_credit": "yes"}, "dataset.options.partial_credit"),
        ({"colour": 1}, "dataset.options.colour: reasoning_gym takes"),
        ({"config": {"products": {"digits": 1}}}, "dataset.options.config.products.digits"),
        ({"tasks": ["chain_sum"], "config": {"products": {}}}, "products is not in tasks"),
    ],
)
def test_wrong_options_name_their_key(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        stream(options)


def test_a_task_set_without_options_refuses_them() -> None:
    with pytest.raises(ConfigError, match="task set 'tool_then_answer' takes no options"):
        TaskStream(path=None, name="tool_then_answer", options={"size": 3})
    with pytest.raises(ConfigError, match=r"dataset\.options\.size: calculator has no such option"):
        TaskStream(path=None, name="calculator", options={"size": 3})  # it takes key_reward


def test_the_held_out_evaluation_scores_greedy_replies(tmp_path: Path) -> None:
    from areal.plugins.models.tiny import init_tiny

    init_tiny(tmp_path / "model", size="nano", seed=0)
    config = {
        "model": {"path": str(tmp_path / "model")},
        "dataset": {"name": "reasoning_gym", "options": ARITHMETIC},
        "sampling": {"max_new_tokens": 4},
    }
    (tmp_path / "run.yaml").write_text(json.dumps(config))
    command = [sys.executable, "-m", "areal.plugins.tasks.heldout_eval", str(tmp_path / "model")]
    command += ["--config", str(tmp_path / "run.yaml"), "--items", "6"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["items"] == 6 and 0.0 <= result["success"] <= result["mean_score"] + 1e-9 <= 1.0
