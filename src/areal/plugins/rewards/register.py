"""Built-in rewards."""

from __future__ import annotations

from areal.core.hookspecs import Register, hookimpl
from areal.plugins.rewards.rules import exact_match, math_answer


@hookimpl
def areal_register_rewards(register: Register) -> None:
    register("exact_match", exact_match)
    register("math_answer", math_answer)
