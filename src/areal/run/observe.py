"""What the run sees of the trajectories the trainer takes: their staleness on arrival, and how
long the queue stayed full (back-pressure on the rollout side). Feeds the live monitor's panels."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from areal.core.metrics import MetricValue
from areal.core.queue import TrajectorySource
from areal.core.types import Trajectory


class ArrivalWindow:
    """A rollout batch's samples by staleness on arrival (``"12,3"``: 12 samples 0 versions behind
    the trainer when they reached it, 3 one behind), and the newest policy version among them."""

    def __init__(self) -> None:
        self.hist: list[int] = []
        self.newest = -1

    def add(self, trajectory: Trajectory, trainer_version: int) -> None:
        for sample in trajectory.samples:
            generated = set(np.unique(sample.versions).tolist())  # -1: prompt tokens
            generated.discard(-1)
            if not generated:
                continue
            self.newest = max(self.newest, max(generated))
            lag = max(0, trainer_version - min(generated))
            self.hist.extend([0] * (lag + 1 - len(self.hist)))
            self.hist[lag] += 1

    def take(self) -> dict[str, MetricValue]:
        values: dict[str, MetricValue] = {
            "version": self.newest,
            "staleness_hist": ",".join(map(str, self.hist)),
        }
        self.hist, self.newest = [], -1
        return values


class ObservedSource:
    """The trajectory queue, with every trajectory shown to ``observe`` as the trainer takes it,
    and the time it spent full (back-pressure on the rollout side), sampled at each take."""

    def __init__(
        self, source: TrajectorySource, observe: Callable[[Trajectory], None], limit: int
    ) -> None:
        self.source = source
        self.observe = observe
        self.limit = limit
        self._full_s = 0.0
        self._last = time.monotonic()
        self._was_full = False

    async def aget(self, timeout: float | None = None) -> Trajectory | None:
        self.full_seconds()
        trajectory = await self.source.aget(timeout)
        if trajectory is not None:
            self.observe(trajectory)
        return trajectory

    def full_seconds(self) -> float:
        """Seconds the queue was at ``queue_max_size`` so far (as seen at each sample)."""
        now = time.monotonic()
        if self._was_full:
            self._full_s += now - self._last
        self._last = now
        self._was_full = self.source.buffered >= self.limit
        return self._full_s
