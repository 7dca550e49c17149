"""What a reward plugin provides (``areal_register_rewards``): a function of the episode's final
answer and its task, returning a reward in [0, 1]. It may be async (the caller awaits it), e.g. a
judge that calls the router's judge model through the unified channel."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any, Protocol


class RewardFn(Protocol):
    def __call__(self, *, completion: str, task: Mapping[str, Any]) -> float | Awaitable[float]: ...
