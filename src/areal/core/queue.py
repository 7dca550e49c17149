"""The seam between the gateway (producer) and the trainer (consumer) of trajectories.

A queue plugin (``areal_register_queues``) registers a factory ``(options: dict) -> TrajectorySink``.
Built in: ``jsonl`` (a file, to inspect what would be trained) and ``zmq`` (acknowledged, bounded
delivery to the trainer's ``ZmqTrajectorySource``).
"""

from __future__ import annotations

from typing import Any, Protocol

from areal.core.types import Trajectory


class TrajectorySink(Protocol):
    async def put(self, trajectory: Trajectory) -> None:
        """Hand one finished episode on; may wait (back-pressure) but never drops it."""
        ...

    async def close(self) -> None: ...


def make_sink(name: str, options: dict[str, Any]) -> TrajectorySink:
    """Build the sink a plugin registered under ``name`` (an unknown name lists the known ones)."""
    from areal.core.plugins import registry

    factory = registry("queues").get(name, key="trajectory sink")
    sink: TrajectorySink = factory(options)
    return sink
