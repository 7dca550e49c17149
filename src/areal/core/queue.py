"""The seam between the gateway (producer) and the trainer (consumer) of trajectories.

A queue plugin (``areal_register_queues``) registers a factory ``(options: dict) -> TrajectorySink``
under its name, and, when it has a consumer end, a factory ``(options) -> TrajectorySource`` under
``{name}/source``. Built in: ``jsonl`` (a file, to inspect what would be trained) and ``zmq``
(acknowledged, bounded delivery to the trainer's ``ZmqTrajectorySource``).
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


class TrajectorySource(Protocol):
    """The trainer's end of a queue: bound at ``address``, holding what producers delivered."""

    @property
    def address(self) -> str: ...

    @property
    def buffered(self) -> int: ...

    @property
    def buffered_tombstones(self) -> int:
        """Buffered trajectories that are tombstones (``Trajectory.is_tombstone``)."""
        ...

    received: int

    def get(self, timeout: float | None = None) -> Trajectory | None:
        """The next trajectory, or ``None`` after ``timeout`` (or once closed and empty)."""
        ...

    async def aget(self, timeout: float | None = None) -> Trajectory | None: ...

    def close(self) -> None:
        """Stop receiving; what is buffered stays available to ``get``."""
        ...


def make_source(name: str, options: dict[str, Any]) -> TrajectorySource:
    """Build the consumer end of queue ``name`` (registered as ``{name}/source``)."""
    from areal.core.plugins import registry

    factory = registry("queues").get(f"{name}/source", key="trajectory source")
    source: TrajectorySource = factory(options)
    return source
