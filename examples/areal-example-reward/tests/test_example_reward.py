"""The plugin's own tests: the reward by hand-computed values, the panel with a fake monitor view,
the command through areal's real root app, and the hooks through areal's real plugin manager."""

from __future__ import annotations

import json
from typing import Any

import pytest
from areal_example_reward import plugin
from areal_example_reward.panel import render_reward_trend, sparkline, trend
from areal_example_reward.reward import concise_answer, final_line
from rich.console import Console
from typer.testing import CliRunner

from areal.cli.main import make_app
from areal.core.plugins import make_plugin_manager, registry


@pytest.mark.parametrize(
    ("completion", "task", "expected"),
    [
        ("42", {"answer": "42"}, 1.0),
        ("Let me think.\nThe answer is 42.", {"answer": "42"}, 1.0),
        ("so it is Paris", {"answer": "paris"}, 1.0),
        ("The answer is 41.", {"answer": "42"}, 0.0),
        ("142", {"answer": "42"}, 0.0),  # a whole word, not a suffix
        ("", {"answer": "42"}, 0.0),
        (" ".join(["word"] * 7) + " 42", {"answer": "42", "word_budget": 4}, 0.5),
        ("one two 42", {"answer": "42", "word_budget": 3}, 1.0),
    ],
)
def test_concise_answer_by_hand(completion: str, task: dict[str, Any], expected: float) -> None:
    assert concise_answer(completion=completion, task=task) == pytest.approx(expected)


def test_concise_answer_needs_a_reference() -> None:
    with pytest.raises(KeyError, match="answer"):
        concise_answer(completion="42", task={})


def test_final_line_reads_the_committed_answer() -> None:
    assert final_line("work...\n\nAnswer: 12 apples ") == "12 apples"


class FakeView:
    """The monitor's view protocol over a fixed list of rollout rewards."""

    def __init__(self, rewards: list[float]) -> None:
        self.rewards = rewards

    def latest(self, event: str) -> dict[str, Any]:
        return {"reward": self.rewards[-1]} if event == "rollout" and self.rewards else {}

    def series(self, event: str, key: str) -> list[float]:
        return list(self.rewards) if (event, key) == ("rollout", "reward") else []


def _text(renderable: Any) -> str:
    console = Console(record=True, width=80, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_panel_shows_latest_best_and_rising_trend() -> None:
    rewards = [0.1] * 10 + [0.3] * 9 + [0.25]
    text = _text(render_reward_trend(FakeView(rewards)))
    assert "reward trend" in text
    assert "0.250" in text and "0.300" in text  # latest, best
    assert "▲ +0.195" in text  # mean(0.3*9, 0.25) - 0.1
    assert "20" in text  # rollouts seen


def test_panel_before_any_rollout_does_not_raise() -> None:
    assert "waiting" in _text(render_reward_trend(FakeView([])))


def test_sparkline_and_trend() -> None:
    assert sparkline([0.0, 0.5, 1.0]) == "▁▅█"
    assert sparkline([2.0, 2.0]) == "▅▅"
    assert trend([1.0] * 5) is None
    assert trend([0.0] * 10 + [1.0] * 10) == pytest.approx(1.0)


def _pm() -> Any:
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(plugin, name="example-reward")
    return pm


def test_hooks_register_reward_command_and_panel() -> None:
    pm = _pm()
    assert registry("rewards", pm).get("concise_answer") is concise_answer
    assert registry("monitor_panels", pm).get("reward-trend") is render_reward_trend
    result = CliRunner().invoke(
        make_app(pm), ["example-reward", "score", "The answer is 7", "--answer", "7", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"reward": 1.0, "words": 4}
