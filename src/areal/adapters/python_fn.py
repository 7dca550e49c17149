"""``python``: a plain :data:`~areal.run.rollout.AgentFn` (``agent(episode)``), run unchanged.

The agent gets the :class:`~areal.run.rollout.Episode` itself and builds whatever client it
likes from ``episode.base_url`` and ``episode.api_key`` (task sets' agents are written this way).
"""

from __future__ import annotations

import inspect
from typing import Any

from areal.adapters.base import Adapter, AdapterError, Result
from areal.core.episode import Episode


class PythonAdapter(Adapter):
    framework = "python"
    harness = False
    runs_unchanged = True  # the rollout worker calls the agent itself

    def __init__(self, agent: Any, **options: Any) -> None:
        if not callable(agent):
            raise AdapterError(f"framework python: {agent!r} is not a function agent(episode)")
        super().__init__(agent, **options)

    async def agent_fn(self, episode: Episode) -> Result:
        out = self.agent(episode)
        return await out if inspect.isawaitable(out) else out  # type: ignore[no-any-return]
