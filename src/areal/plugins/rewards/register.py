"""Built-in rewards: rules (``exact_match``, ``math_answer``) and models (``judge``,
``reward_model``, built per run with :func:`areal.core.rewards.build_reward`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from areal.core.hookspecs import Register, hookimpl
from areal.plugins.rewards.rules import exact_match, math_answer


class ModelRewardFactory:
    """A registry entry for a model-given reward: it needs the run's gateway and model id, so the
    rollout worker builds it (``from_options``); aiohttp is imported only then."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def from_options(self, options: Mapping[str, Any]) -> Any:
        from areal.plugins.rewards.model_judged import ModelReward

        return ModelReward.from_options(options, self.kind)


@hookimpl
def areal_register_rewards(register: Register) -> None:
    register("exact_match", exact_match)
    register("math_answer", math_answer)
    register("judge", ModelRewardFactory("judge"))
    register("reward_model", ModelRewardFactory("reward_model"))
