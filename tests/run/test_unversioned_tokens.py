"""A token whose version is not one of the run's (an engine's start-up label ``"default"``, a
missing label, another run's newer number) is never trained as fresh: its sample is dropped as
stale, counted as ``dropped_unversioned`` and logged. One real step on the nano model; what it
trained is read from the loop's own record of the batch."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
import torch

from areal.core.types import Sample, Trajectory
from areal.plugins.models.hf_io import load_model
from areal.plugins.queues.zmq_queue import ZmqTrajectorySource
from areal.plugins.trainer.engine import Policy
from areal.plugins.trainer.weight_sync import DiskWeightSync
from areal.run.loop import TrainerLoop

VERSION = 2  # the trainer's version: the run has published versions 1 and 2


def episode(name: str, versions: list[int]) -> Trajectory:
    """One sample: a 2-token prompt, then a token per entry of ``versions`` (-1: "default")."""
    n = len(versions)
    sample = Sample(
        input_ids=[3, 4] + [10 + i for i in range(n)],
        loss_mask=[0, 0] + [1] * n,
        logprobs=[0.0, 0.0] + [-2.0] * n,
        versions=[-1, -1, *versions],
        reward=float(n),
    )
    return Trajectory(name, [sample], float(n), 1)


def test_samples_without_a_run_version_are_dropped_counted_and_never_trained(
    model_dir: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = load_model(model_dir)
    policy = Policy.of(model, torch.optim.AdamW(model.parameters()), mini_batch_size=2)
    with ZmqTrajectorySource("tcp://127.0.0.1:*") as source:
        loop = TrainerLoop(
            policy,
            source,
            DiskWeightSync([], tmp_path),
            trigger_batch_size=2,
            staleness_threshold=1,
            start_version=VERSION,
        )
        with caplog.at_level(logging.WARNING, logger="areal.run.loop"):
            for trajectory in (
                episode("current", [2, 2]),
                episode("default", [-1, -1]),  # an engine that never got a run version
                episode("one-behind", [1, 1]),  # within the bound: trained, at its real age
                episode("mixed", [2, -1]),  # one unreadable token spoils the sample
                episode("future", [7]),  # labelled by another run: not a version of this one
            ):
                loop.add(trajectory)
        counters = loop.counters()
        assert counters["dropped_unversioned"] == 3
        assert counters["dropped_stale"] == 3  # they count as stale: the books stay one rule
        assert counters["dropped_trajectories"] == 3
        assert "carry no run version" in caplog.text
        history = asyncio.run(loop.run(max_steps=1))

    assert {session for session, _meta in loop.last_batch} == {"current", "one-behind"}
    assert history[0]["max_staleness"] == 1.0  # the oldest trained token is version 1
    counters = loop.counters()
    assert (counters["trained"], counters["dropped"], counters["buffered"]) == (2, 3, 0)
    assert counters["received"] == counters["trained"] + counters["dropped"] + counters["buffered"]
