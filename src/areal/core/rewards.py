"""What a reward plugin provides (``areal_register_rewards``): a function of the episode's final
answer and its task, returning a reward in [0, 1]. It may be async (the caller awaits it), e.g. a
judge that calls the router's judge model through the unified channel."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any, Protocol


class RewardFn(Protocol):
    def __call__(self, *, completion: str, task: Mapping[str, Any]) -> float | Awaitable[float]: ...


def build_reward(name: str, options: Mapping[str, Any] | None = None) -> RewardFn:
    """The reward registered as ``name``, built with ``options`` when it needs them (an entry with
    ``from_options``, such as ``judge``: the run's gateway URL and the model id)."""
    from areal.core.plugins import registry

    entry = registry("rewards").get(name, key="reward")
    build = getattr(entry, "from_options", None)
    if callable(build):
        fn: RewardFn = build(dict(options or {}))
        return fn
    return entry  # type: ignore[no-any-return]
