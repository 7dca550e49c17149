"""The entry point (``[project.entry-points.areal]`` in pyproject.toml): three hooks, each
registering one thing. Only light modules are imported here, so ``areal --help`` stays fast."""

from __future__ import annotations

from typing import Any

from areal import hookimpl
from areal.core.hookspecs import Register
from areal_example_reward.reward import concise_answer

REWARD_NAME = "concise_answer"


@hookimpl
def areal_register_rewards(register: Register) -> None:
    register(REWARD_NAME, concise_answer)


@hookimpl
def areal_register_commands(cli: Any) -> None:
    from areal_example_reward.cli import app

    cli.add_typer(app, name="example-reward")


@hookimpl
def areal_register_monitor_panels(register: Register) -> None:
    from areal_example_reward.panel import render_reward_trend

    register("reward-trend", render_reward_trend)
