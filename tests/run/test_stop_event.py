"""``train(..., stop=event)``: a run on a thread of its own (where no signal reaches it) is asked
to stop by setting a ``threading.Event`` from any thread. The trainer loop reads it between
steps, as it reads a signal's: the step in progress finishes, no next one starts, and a loop
waiting for trajectories returns without one. (The whole run stopped this way, with its summary's
``stopped_by="requested"``: ``test_attached_run.py``.)"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from areal.core.types import Sample, Trajectory
from areal.run.loop import TrainerLoop

STATS = {"loss": 0.0, "grad_norm": 0.0, "clip_fraction": 0.0}


def member(group: str, i: int) -> Trajectory:
    sample = Sample([3, 4, 5 + i], [0, 0, 1], [0.0, 0.0, -1.5], [-1, -1, 0], reward=float(i))
    return Trajectory(f"{group}-{i}", [sample], float(i), 1, {"group": group, "group_size": 2})


class Stepping:
    """An engine whose every step runs ``during_step`` (on the trainer's thread) first."""

    def __init__(self, during_step: Any) -> None:
        self.during_step = during_step
        self.steps = 0

    def step(self, samples: list[Sample], **_: Any) -> dict[str, float]:
        self.steps += 1
        self.during_step()
        return dict(STATS)

    def weights(self) -> None:
        return None


class Queue:
    """The trajectories given, then nothing; ``when_empty`` runs at each look at an empty one."""

    def __init__(self, trajectories: list[Trajectory], when_empty: Any = None) -> None:
        self.trajectories = list(trajectories)
        self.when_empty = when_empty

    async def aget(self, timeout: float | None = None) -> Trajectory | None:
        if self.trajectories:
            return self.trajectories.pop(0)
        if self.when_empty is not None:
            self.when_empty()
        return None


class NoPublish:
    async def publish(self, weights: Any, version: int) -> float:
        return 0.0


def set_from_another_thread(event: threading.Event) -> None:
    setter = threading.Thread(target=event.set)
    setter.start()
    setter.join()


def test_a_stop_set_during_a_step_ends_the_loop_after_that_step() -> None:
    stop = threading.Event()
    engine = Stepping(lambda: set_from_another_thread(stop))
    batches = [member(g, i) for g in ("a", "b", "c") for i in range(2)]  # three steps' worth
    loop = TrainerLoop(
        engine, Queue(batches), NoPublish(), trigger_batch_size=2, staleness_threshold=2
    )
    history = asyncio.run(loop.run(max_steps=10, stop=stop))
    assert engine.steps == len(history) == 1
    assert history[0]["step"] == 1.0 and loop.version == 1
    assert loop.buffered_trajectories == 4  # the other two steps' worth waits for the next run


def test_a_stop_set_while_the_loop_waits_for_trajectories_ends_it_with_no_step() -> None:
    stop = threading.Event()
    engine = Stepping(lambda: None)
    queue = Queue([member("a", 0)], when_empty=lambda: set_from_another_thread(stop))
    loop = TrainerLoop(engine, queue, NoPublish(), trigger_batch_size=2, staleness_threshold=2)
    assert asyncio.run(loop.run(max_steps=10, stop=stop)) == []
    assert engine.steps == 0 and loop.buffered_trajectories == 1
