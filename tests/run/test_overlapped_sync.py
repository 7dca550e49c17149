"""Async mode overlaps the engines' half of the weight sync with the next train step: the step
waits only for the save, the engine loads the version meanwhile, and the version is announced
(``on_published``) once the engine serves it. Sync mode, and async mode with the overlap turned
off, wait for the whole sync. A real embedded engine, the real disk sync, real torch steps."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from areal.core.types import Sample, Trajectory
from areal.plugins.inference.sglang_client import InferenceClient
from areal.plugins.models.hf_io import load_model
from areal.plugins.queues.zmq_queue import ZmqTrajectorySink, ZmqTrajectorySource
from areal.plugins.trainer.engine import Policy
from areal.plugins.trainer.weight_sync import DiskWeightSync, WeightSyncError
from areal.run.loop import Published, TrainerLoop

HOLD_S = 20.0  # how long a held delivery waits for the next step before the test fails


def sample(version: int) -> Sample:
    return Sample(
        input_ids=[3, 4, 30, 31],
        loss_mask=[0, 0, 1, 1],
        logprobs=[0.0, 0.0, -2.0, -2.0],
        versions=[-1, -1, version, version],
    )


def trajectories(version: int) -> list[Trajectory]:
    """One step's worth (a batch of 2) sampled by ``version`` (fresh for sync mode too)."""
    return [Trajectory(f"t{version}-{i}", [sample(version)], float(i), 1) for i in range(2)]


def after_step_1(source: ZmqTrajectorySource) -> Callable[[dict[str, float]], Awaitable[None]]:
    """An ``on_step`` that queues version 1's trajectories once step 1 has made version 1: a
    version the trainer has not made yet is no version of the run (core.staleness)."""
    done = False

    async def on_step(_: dict[str, float]) -> None:
        nonlocal done
        if not done:
            done = True
            sink = ZmqTrajectorySink(source.address)
            for trajectory in trajectories(1):
                await sink.put(trajectory)  # returns once the queue holds it
            await sink.close()

    return on_step


class Recorder:
    """A real policy step that notes when each step starts and ends, beside the publishes."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.events: list[str] = []
        self.lock = threading.Lock()
        self.step_started: dict[int, threading.Event] = {2: threading.Event()}

    def note(self, event: str) -> None:
        with self.lock:
            self.events.append(event)

    def step(self, samples: list[Sample], *, group_ids: list[int], current_version: int) -> Any:
        self.note(f"step {current_version + 1} starts")
        self.step_started.setdefault(current_version + 1, threading.Event()).set()
        stats = self.policy.step(samples, group_ids=group_ids, current_version=current_version)
        self.note(f"step {current_version + 1} ends")
        return stats

    def weights(self) -> Any:
        return self.policy.weights()


class HeldDiskSync(DiskWeightSync):
    """The real disk sync, whose delivery of version 1 waits until step 2 has started: only a
    loop that does not wait for the delivery gets past it."""

    recorder: Recorder

    async def deliver(self, version: int) -> float:
        if version == 1:
            started = self.recorder.step_started[2]
            if not await asyncio.to_thread(started.wait, HOLD_S):
                raise AssertionError("step 2 never started while version 1 was being delivered")
        return await super().deliver(version)


@pytest.mark.parametrize("mode", ["overlapped", "no_overlap", "sync_mode"])
def test_the_engines_load_a_version_while_the_next_step_trains(
    engine_url: str, model_dir: str, tmp_path: Path, queued: Any, mode: str
) -> None:
    model = load_model(model_dir)
    recorder = Recorder(
        Policy.of(model, torch.optim.AdamW(model.parameters(), lr=1e-3), mini_batch_size=2)
    )
    sync_class = HeldDiskSync if mode == "overlapped" else DiskWeightSync
    sync = sync_class([engine_url], tmp_path / "weights")
    if isinstance(sync, HeldDiskSync):
        sync.recorder = recorder
    served: list[str] = []

    async def scenario() -> tuple[TrainerLoop, list[dict[str, float]], list[Published], str]:
        published: list[Published] = []
        async with queued(trajectories(0)) as source, InferenceClient(engine_url) as client:
            loop = TrainerLoop(
                recorder,
                source,
                sync,
                trigger_batch_size=2,
                global_batch_size=2,
                staleness_threshold=4,
                async_enabled=mode != "sync_mode",
                overlap_sync=mode != "no_overlap",
            )

            async def on_published(done: Published) -> None:
                # Announced only once the engine serves it.
                served.append((await client.model_info())["weight_version"])
                recorder.note(f"version {done.version} served")
                published.append(done)

            history = await loop.run(
                max_steps=2, on_step=after_step_1(source), on_published=on_published
            )
            final = (await client.model_info())["weight_version"]
        await sync.close()
        return loop, history, published, final

    loop, history, published, final = asyncio.run(scenario())
    assert loop.overlap_sync is (mode == "overlapped")
    assert final == "2"  # the run returns once the engine serves the last version
    assert served == ["1", "2"]
    assert [(p.step, p.version) for p in published] == [(1, 1), (2, 2)]
    if mode == "overlapped":
        # Step 2 trained while the engine was still to load version 1.
        assert recorder.events.index("step 2 starts") < recorder.events.index("version 1 served")
        # The step waited for the save alone; the sync's whole time includes the held delivery.
        assert history[0]["sync_seconds"] < published[0].seconds
    else:
        assert recorder.events == [
            "step 1 starts",
            "step 1 ends",
            "version 1 served",
            "step 2 starts",
            "step 2 ends",
            "version 2 served",
        ]
        assert history[0]["sync_seconds"] == pytest.approx(published[0].seconds, abs=0.05)
    # Whatever the order, the engine serves exactly the trainer's final weights' checkpoint.
    saved = load_model(sync.version_dir(2)).state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(saved[name], tensor), name


def test_a_failed_delivery_stops_the_run_before_the_next_version(
    model_dir: str, tmp_path: Path, queued: Any
) -> None:
    """The engine half fails beside step 2 (nothing listens at the engine's address): the run
    raises it at its next publish, and version 2 is neither saved nor announced."""
    with contextlib.closing(socket.socket()) as free:
        free.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{free.getsockname()[1]}"  # closed again before the sync
    model = load_model(model_dir)
    policy = Policy.of(model, torch.optim.AdamW(model.parameters(), lr=1e-3), mini_batch_size=2)
    sync = DiskWeightSync([url], tmp_path, pause_timeout=5.0, continue_timeout=5.0)
    published: list[Published] = []

    async def scenario() -> TrainerLoop:
        async def on_published(done: Published) -> None:
            published.append(done)

        async with queued(trajectories(0)) as source:
            loop = TrainerLoop(policy, source, sync, trigger_batch_size=2, staleness_threshold=4)
            try:
                await loop.run(max_steps=2, on_step=after_step_1(source), on_published=on_published)
            finally:
                await sync.close()
            return loop

    with pytest.raises(WeightSyncError) as err:
        asyncio.run(scenario())
    assert (err.value.phase, err.value.url) == ("pause", url)
    assert published == []
    assert (tmp_path / "v1").is_dir() and not (tmp_path / "v2").exists()
