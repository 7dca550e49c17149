"""The trainer loop end to end on real parts: the embedded engine generates, a producer puts
trajectories on the ZeroMQ queue, the loop trains two steps and syncs the weights through disk."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from areal.core.inference_records import GenerateOutput
from areal.core.metrics import make_metric_sink
from areal.core.types import Sample, Trajectory, version_number
from areal.plugins.inference.sglang_client import InferenceClient
from areal.plugins.metrics.jsonl import read_metrics
from areal.plugins.models.hf_io import load_model
from areal.plugins.queues.zmq_queue import ZmqTrajectorySink, ZmqTrajectorySource
from areal.plugins.trainer.engine import Policy
from areal.plugins.trainer.weight_sync import DiskWeightSync, WeightSyncError
from areal.run.loop import TrainerLoop
from areal.run.trainer_thread import THREAD_NAME
from support import eventually_async

PROMPTS = [[11, 12, 13, 14], [21, 22, 23]]


def to_sample(prompt: list[int], out: GenerateOutput) -> Sample:
    """A training sample exactly as generated: prompt + output, mask and log-probs on outputs."""
    n = len(out.output_ids)
    assert len(out.output_logprobs) == n
    return Sample(
        input_ids=prompt + out.output_ids,
        loss_mask=[0] * len(prompt) + [1] * n,
        logprobs=[0.0] * len(prompt) + out.output_logprobs,
        versions=[-1] * len(prompt) + [version_number(v) for v in out.token_versions()],
    )


async def group_trajectories(client: InferenceClient, tag: str) -> list[Trajectory]:
    """Two answers to each prompt; in each group the first answer is rewarded."""
    trajectories = []
    for t, prompt in enumerate(PROMPTS):
        for a in range(2):
            out = await client.generate(
                input_ids=prompt,
                sampling_params={"max_new_tokens": 6, "temperature": 1.0, "ignore_eos": True},
            )
            reward = 1.0 if a == 0 else 0.0
            trajectories.append(
                Trajectory(
                    session_id=f"{tag}-{t}-{a}",
                    samples=[dataclasses.replace(to_sample(prompt, out), reward=reward)],
                    reward=reward,
                    completions=1,
                    metadata={"group": f"{tag}-{t}"},
                )
            )
    return trajectories


async def wait_version(client: InferenceClient, version: str, timeout: float = 60.0) -> None:
    async def serves() -> bool:
        return (await client.model_info())["weight_version"] == version

    await eventually_async(serves, timeout, f"the engine to serve version {version}")


def recording_threads(policy: Policy, names: list[str]) -> Policy:
    """``policy``, its ``step`` and ``weights`` noting the thread each call runs on."""
    for method in ("step", "weights"):
        call = getattr(policy, method)

        def recorded(*args: Any, _call: Any = call, **kwargs: Any) -> Any:
            names.append(threading.current_thread().name)
            return _call(*args, **kwargs)

        setattr(policy, method, recorded)
    return policy


def test_two_steps_sync_weights_and_account_for_every_sample(
    engine_url: str, model_dir: str, tmp_path: Path
) -> None:
    model = load_model(model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sync = DiskWeightSync([engine_url], tmp_path / "weights")
    metrics = make_metric_sink("jsonl", {"log_dir": str(tmp_path / "logs")})

    async def scenario() -> tuple[TrainerLoop, list[dict[str, float]], GenerateOutput]:
        with ZmqTrajectorySource("tcp://127.0.0.1:*") as source:
            loop = TrainerLoop(
                recording_threads(Policy.of(model, optimizer, mini_batch_size=2), engine_threads),
                source,
                sync,
                trigger_batch_size=4,
                staleness_threshold=0,
                metrics=metrics,
            )
            sink = ZmqTrajectorySink(source.address)
            async with InferenceClient(engine_url) as client:
                first = await group_trajectories(client, "a")  # version 0
                stale = await group_trajectories(client, "stale")  # version 0, sent late
                run = asyncio.create_task(loop.run(max_steps=2))

                # A long generation that is still running when version 1 is published.
                stream = client.generate_stream(
                    input_ids=[5, 6, 7],
                    sampling_params={"max_new_tokens": 400, "ignore_eos": True},
                )
                long_out = await anext(stream)
                for trajectory in first:
                    await sink.put(trajectory)
                await wait_version(client, "1")
                # Now at version 1, a version-0 sample is 1 stale (> 0): dropped on arrival.
                await sink.put(stale[0])
                for trajectory in await group_trajectories(client, "b"):  # version 1
                    await sink.put(trajectory)
                history = await asyncio.wait_for(run, 30)
                async for chunk in stream:
                    long_out = chunk
                await sink.close()
                info = await client.model_info()
            await sync.close()
            assert info["weight_version"] == "2"
            return loop, history, long_out

    engine_threads: list[str] = []
    loop, history, long_out = asyncio.run(scenario())
    metrics.close()
    # Every step and every weight gather ran on the trainer's one thread.
    assert len(engine_threads) == 4 and len(set(engine_threads)) == 1
    assert engine_threads[0].startswith(THREAD_NAME)

    # The published checkpoint is exactly the trainer's model; only the last 2 versions remain.
    published = load_model(sync.version_dir(2))
    trained = model.state_dict()
    for name, tensor in published.state_dict().items():
        assert torch.equal(tensor, trained[name]), name
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v1", "v2"]

    # The long generation resumed across the publish and says which tokens each version made.
    assert long_out.finished and len(long_out.output_ids) == 400
    assert {span.version for span in long_out.weight_versions} >= {"0", "1"}

    assert [h["version"] for h in history] == [1.0, 2.0]
    # The step's thread CPU time: real work, never more than the step's wall time.
    assert all(0 < h["train_cpu_seconds"] <= h["train_seconds"] for h in history)
    assert [h["updated"] for h in history] == [4.0, 4.0]
    assert [h["groups"] for h in history] == [2.0, 2.0]
    counters = loop.counters()
    assert counters["received"] == 9
    assert counters["trained"] == 8
    assert counters["dropped_stale"] == 1
    assert (counters["dropped_stale_waiting"], counters["dropped_stale_tokens"]) == (0, 6)
    assert counters["buffered"] == 0
    assert counters["received"] == counters["trained"] + counters["dropped"] + counters["buffered"]

    records = [r for r in read_metrics(tmp_path / "logs") if r["event"] == "train"]
    assert [(r["step"], r["updated"], r["dropped_stale"]) for r in records] == [
        (1, 4, 0),
        (2, 4, 1),
    ]
    # A step's tokens: every trained sample's prompt and its 6 generated tokens, 2 per prompt.
    step_tokens = sum(2 * (len(prompt) + 6) for prompt in PROMPTS)
    assert [h["tokens"] for h in history] == [step_tokens, step_tokens]
    assert [r["tokens"] for r in records] == [step_tokens, step_tokens]


def test_an_engine_that_never_answers_fails_the_pause_within_its_timeout(
    model_dir: str, tmp_path: Path
) -> None:
    with contextlib.closing(socket.socket()) as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # connections complete in the backlog; no HTTP answer ever comes
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        sync = DiskWeightSync([url], tmp_path, pause_timeout=0.5, continue_timeout=0.5)
        model = load_model(model_dir)

        async def publish() -> None:
            try:
                await sync.publish(model, 1)
            finally:
                await sync.close()

        started = time.monotonic()
        with pytest.raises(WeightSyncError) as err:
            asyncio.run(publish())
        elapsed = time.monotonic() - started
    assert err.value.phase == "pause"
    assert err.value.url == url
    assert "pause" in str(err.value) and url in str(err.value)
    assert elapsed < 5.0
    assert (tmp_path / "v1" / "model.safetensors").is_file()  # saved before the engines failed


def token_sample(tokens: list[int], version: int) -> Sample:
    """A hand-made sample: a 2-token prompt, then ``tokens`` generated by ``version``."""
    prompt = [3, 4]
    return Sample(
        input_ids=prompt + tokens,
        loss_mask=[0, 0] + [1] * len(tokens),
        logprobs=[0.0, 0.0] + [-2.0] * len(tokens),
        versions=[-1, -1] + [version] * len(tokens),
    )


def test_sync_mode_trains_current_version_batches_grouped_by_task(
    model_dir: str, tmp_path: Path, queued: Any
) -> None:
    """Sync mode: ``global_batch_size`` episodes of the current version per step, however many
    samples each has. A task's trajectories share a group; a trajectory without one is its own;
    an old sample is dropped."""
    model = load_model(model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sync = DiskWeightSync([], tmp_path)  # no engines: the checkpoint is still written
    trajectories = [
        Trajectory("t1", [token_sample([30, 31], 0)], 1.0, 1, metadata={"task_id": "x"}),
        Trajectory("t2", [token_sample([32, 33], 0)], 0.0, 1, metadata={"task_id": "x"}),
        # Version 0; taken in with the others before the first batch, stale once it is trained.
        Trajectory("t3", [token_sample([34], 0)], 1.0, 1),
    ]
    # Sampled by version 1: they reach the queue once the engines serve it, after step 1 (a
    # version the trainer has not made yet is no version of the run: core.staleness).
    version_1 = [
        Trajectory("t4", [token_sample([35], 1), token_sample([36, 37], 1)], 0.5, 2),
        Trajectory("t5", [token_sample([38], 1)], 0.0, 1),
    ]

    async def scenario() -> tuple[TrainerLoop, list[dict[str, float]]]:
        async with queued(trajectories) as source:
            loop = TrainerLoop(
                Policy.of(model, optimizer, mini_batch_size=2),
                source,
                sync,
                trigger_batch_size=1,  # ignored in sync mode
                global_batch_size=2,
                staleness_threshold=5,  # forced to 0 in sync mode
                async_enabled=False,
            )

            async def after_step(_: dict[str, float]) -> None:
                if loop.version == 1:
                    sink = ZmqTrajectorySink(source.address)
                    for trajectory in version_1:
                        await sink.put(trajectory)
                    await sink.close()

            return loop, await loop.run(max_steps=2, on_step=after_step)

    loop, history = asyncio.run(scenario())
    assert loop.staleness_threshold == 0
    assert [(h["version"], h["updated"], h["groups"]) for h in history] == [
        (1.0, 2.0, 1.0),
        (2.0, 3.0, 2.0),  # two episodes, three samples
    ]
    assert [h["max_staleness"] for h in history] == [0.0, 0.0]
    assert loop.counters() == {
        "version": 2,
        "steps": 2,
        "trajectories": 5,
        "received": 6,
        "trained": 5,
        "dropped": 1,
        "dropped_stale": 1,
        "dropped_stale_waiting": 1,  # it arrived fresh and went stale waiting
        "dropped_stale_tokens": 1,  # the engine work lost with it
        "dropped_unversioned": 0,
        "dropped_empty": 0,
        "dropped_trajectories": 1,  # its only sample was stale: the whole episode is gone
        "discarded": 0,
        "groups_split": 0,
        "groups_split_at_bound": 0,
        "dropped_late": 0,
        "dropped_late_tokens": 0,
        "buffered": 0,
        "buffered_trajectories": 0,
    }
    assert (tmp_path / "v2" / "model.safetensors").is_file()


def test_stale_samples_are_told_apart_by_where_they_went_stale(
    model_dir: str, tmp_path: Path
) -> None:
    """A sample that arrives stale and one that goes stale waiting in the buffer (its group
    incomplete while the version moved) are both dropped; the second is also counted as
    ``dropped_stale_waiting``, and both their generated tokens as ``dropped_stale_tokens``."""
    model = load_model(model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    group = {"task_id": "g", "group_size": 3}
    with ZmqTrajectorySource("tcp://127.0.0.1:*") as source:
        loop = TrainerLoop(
            Policy.of(model, optimizer, mini_batch_size=2),
            source,
            DiskWeightSync([], tmp_path),
            trigger_batch_size=1,
            staleness_threshold=1,
        )
        loop.add(Trajectory("early", [token_sample([30, 31, 32], 0)], 1.0, 1, metadata=group))
        assert loop.counters()["dropped_stale"] == 0  # fresh at version 0: it waits for its group
        loop.version = 2  # two steps of other groups later
        loop.add(Trajectory("late", [token_sample([33, 34], 0)], 0.0, 1, metadata=group))
        assert loop._take_batch() is None  # the buffer ages: "early" is 2 versions old now
    counters = loop.counters()
    assert (counters["dropped_stale"], counters["dropped_stale_waiting"]) == (2, 1)
    assert counters["dropped_stale_tokens"] == 3 + 2
    assert counters["received"] == counters["trained"] + counters["dropped"] + counters["buffered"]


def test_weight_sync_pause_mode_is_checked(tmp_path: Path) -> None:
    assert DiskWeightSync([], tmp_path, pause_mode="in_place").pause_mode == "in_place"
    with pytest.raises(ValueError, match="retract or in_place"):
        DiskWeightSync([], tmp_path, pause_mode="abort")


def test_token_staleness_counts_every_generated_token_by_its_own_version() -> None:
    from areal.core.types import Sample
    from areal.run.loop import token_staleness

    def sample(versions: list[int]) -> Sample:
        n = len(versions)
        mask = [int(v >= 0) for v in versions]
        return Sample(list(range(n)), mask, [0.0] * n, versions)

    # Trained at version 3: a sample split by an update (2 tokens of v1, 2 of v3) and one of v2.
    stats = token_staleness([sample([-1, -1, 1, 1, 3, 3]), sample([-1, 2, 2, 2])], 3)
    # lags: 2, 2, 0, 0, 1, 1, 1 -> 7 / 7 tokens
    assert stats == {"token_staleness": 1.0, "mixed_version_samples": 0.5}
    assert token_staleness([], 3) == {"token_staleness": 0.0, "mixed_version_samples": 0.0}
