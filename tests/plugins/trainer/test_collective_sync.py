"""Collective weight sync for real: the trainer (this process, rank 0) broadcasts its weights over
gloo to an embedded engine running as its own process, bucket by bucket, while the engine's
``/update_weights_from_distributed`` calls are in flight; then the engine generates exactly what
the trainer's model predicts. The watchdog's rule on a fake clock: a phase stalls at its timeout,
not before, and the error names the engines that had not answered; a stopped engine (SIGSTOP)
trips it for real (the wall-clock smoke test)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from areal.gateway.server import embedded_engine
from areal.host.ports import port_holders
from areal.plugins.models.hf_io import load_model
from areal.plugins.models.tiny import init_tiny
from areal.plugins.trainer.collective_sync import CollectiveWeightSync, buckets, hf_tensors
from areal.plugins.trainer.weight_sync import WeightSyncError
from support import eventually_async
from support.clock import FakeSleeps


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("collective") / "nano"
    init_tiny(path, size="nano", seed=0)
    return str(path)


@pytest.fixture(scope="module")
def engine(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with embedded_engine(model_dir, tmp_path_factory.mktemp("engine-logs")) as url:
        yield url


def perturbed(model_dir: str, seed: int) -> Any:
    model = load_model(model_dir)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    return model


def greedy(url: str, prompt: list[int]) -> tuple[list[int], str]:
    body = {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
    }
    out = httpx.post(f"{url}/generate", json=body, timeout=60).json()
    return out["output_ids"], out["meta_info"]["weight_version"]


def predicted(model: Any, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt) :]


def test_buckets_keep_one_dtype_and_the_size_cap() -> None:
    tensors = {
        "a": torch.zeros(10),
        "b": torch.zeros(10),
        "c": torch.zeros(30),
        "d": torch.zeros(4, dtype=torch.float16),
    }
    cut = buckets(tensors, max_bytes=80)
    assert [b.names for b in cut] == [["a", "b"], ["c"], ["d"]]  # c alone exceeds the cap
    assert all(len({t.dtype for t in b.tensors}) == 1 for b in cut)


def test_the_engine_serves_the_broadcast_weights(engine: str, model_dir: str) -> None:
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    before, _ = greedy(engine, prompt)

    async def run() -> tuple[dict[str, float], dict[str, float]]:
        sync = CollectiveWeightSync([engine], bucket_bytes=64 * 1024, update_timeout=60)
        try:
            model = perturbed(model_dir, seed=1)
            n_buckets = len(buckets(hf_tensors(model), 64 * 1024))
            assert n_buckets > 3  # several buckets go over the wire
            await sync.publish(model, 1)
            first = dict(sync.last_phases)
            assert greedy(engine, prompt) == (predicted(model, prompt, 8), "1")
            model = perturbed(model_dir, seed=2)
            await sync.publish(model, 2)  # the same group again
            second = dict(sync.last_phases)
            assert greedy(engine, prompt) == (predicted(model, prompt, 8), "2")
            return first, second
        finally:
            await sync.close()

    first, second = asyncio.run(run())
    assert "join" in first and "join" not in second
    assert set(second) == {"gather", "pause", "update", "continue"}
    assert before != greedy(engine, prompt)[0]


# --- the watchdog, on a fake clock ----------------------------------------------------------

ENGINES = ["http://engine-a:1", "http://engine-b:2"]


class HeldGroup:
    """A weight group whose broadcast waits until :attr:`release` is set: rank 0's side of an
    update that an engine never joined."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def broadcast(self, tensor: torch.Tensor, src: int) -> Any:
        release = self.release

        class Work:
            def wait(self) -> None:
                release.wait(60)

        return Work()


def watched_update(
    answer: Callable[[str], Awaitable[None]],
    check: Callable[[asyncio.Future[None], FakeSleeps], Awaitable[None]],
) -> None:
    """One bucket's update with engine b (rank 2) answering by ``answer`` and engine a at once,
    under a watchdog on a fake clock (update timeout 30 s); ``check`` gets the update and the
    clock once the watchdog's timer runs (or the update ended without it)."""

    async def run() -> None:
        sleeps = FakeSleeps()
        sync = CollectiveWeightSync(ENGINES, update_timeout=30, sleep=sleeps.sleep)
        group = HeldGroup()
        sync._group, sync._members = group, tuple(ENGINES)

        async def one(phase: str, url: str, call: Any) -> None:
            if url == ENGINES[1]:
                await answer(url)

        sync._one = one  # type: ignore[method-assign]
        bucket = buckets({"w": torch.zeros(4)}, 1024)[0]
        update = asyncio.ensure_future(sync._send(bucket, "2/3", None))
        try:
            await eventually_async(
                lambda: sleeps.sleeping or update.done(), 30, "the watchdog's timer (or an end)"
            )
            await check(update, sleeps)
        finally:
            group.release.set()  # the broadcast's thread ends
            update.cancel()
            await asyncio.gather(update, *sync._abandoned, return_exceptions=True)

    asyncio.run(run())


async def never(url: str) -> None:
    await asyncio.Event().wait()


async def stalls_at_the_timeout(update: asyncio.Future[None], sleeps: FakeSleeps) -> None:
    sleeps.advance(29.5)
    assert sleeps.sleeping == 1, "the watchdog gave up before its timeout"
    sleeps.advance(0.5)
    with pytest.raises(WeightSyncError) as caught:
        await update
    err = caught.value
    assert err.phase == "update" and err.stalled and err.url == ENGINES[1]
    assert "rank 0 (the trainer) stalled 30 s in the update of bucket 2/3" in str(err)
    assert str(err).endswith(f"not answered: rank 2 ({ENGINES[1]})")  # engine a answered


def test_the_watchdog_names_the_engine_that_did_not_answer_at_its_timeout() -> None:
    watched_update(never, stalls_at_the_timeout)


def test_an_engine_calls_own_timeout_leaves_the_stall_to_the_watchdog() -> None:
    """The engine call's timeout is the watchdog's too, so either may end first: a call that
    timed out is one that has not answered, and the error is still the watchdog's, at its time,
    naming the engine to restart."""

    async def timed_out(url: str) -> None:
        raise WeightSyncError("update", url, "no answer within 30 s", stalled=True)

    watched_update(timed_out, stalls_at_the_timeout)


def test_an_engine_calls_error_is_raised_as_it_is_before_the_timeout() -> None:
    async def refused(url: str) -> None:
        raise WeightSyncError("update", url, "the engine refused the bucket")

    async def check(update: asyncio.Future[None], sleeps: FakeSleeps) -> None:
        with pytest.raises(WeightSyncError, match="refused the bucket"):
            await update  # the clock never moved

    watched_update(refused, check)


@pytest.mark.serial  # the wall-clock smoke test: an engine process stopped for seconds
def test_a_stopped_engine_is_named_by_the_watchdog(engine: str, model_dir: str) -> None:
    """Stop the engine process (SIGSTOP) right after the pause: its update call never answers
    and rank 0's broadcast cannot finish; after the update timeout the error names the phase,
    the bucket and the engine's rank instead of hanging."""
    (holder,) = port_holders(int(engine.rsplit(":", 1)[1]))
    assert holder.pid is not None

    class StopsAfterPause(CollectiveWeightSync):
        async def _pause_all(self) -> None:
            await super()._pause_all()
            os.kill(holder.pid, signal.SIGSTOP)  # type: ignore[arg-type]

    async def run() -> WeightSyncError:
        sync = StopsAfterPause([engine], update_timeout=3, continue_timeout=3)
        try:
            with pytest.raises(WeightSyncError) as caught:
                await sync.publish(perturbed(model_dir, seed=3), 3)
        finally:
            os.kill(holder.pid, signal.SIGCONT)  # type: ignore[arg-type]
            await sync.close()  # waits for the stalled broadcast's thread to give up
        return caught.value

    err = asyncio.run(run())
    assert err.phase == "update"
    assert "rank 0 (the trainer) stalled 3 s in the update of bucket 1/1" in str(err)
    assert f"not answered: rank 1 ({engine})" in str(err)
    assert err.stalled and err.url == engine  # a supervised run restarts this engine
    # The engine outlives the stall: its cancelled update call is skipped, not fatal.
    assert httpx.get(f"{engine}/health", timeout=10).status_code == 200


@pytest.mark.serial  # a whole `areal train` run: engine, gateway, rollout worker, trainer
def test_areal_train_runs_with_the_collective_sync(tmp_path: Path) -> None:
    """``inference.weight_sync: collective`` in a real run: engine, gateway, rollout worker and
    trainer, with every update broadcast (the first one joins the group) and no weights on disk."""
    from areal.core.run_config import run_config_from_dict
    from areal.run.runner import train

    config = run_config_from_dict(
        {
            "model": {"path": str(tmp_path / "model"), "dtype": "float32", "init_tiny": "nano"},
            "dataset": {"name": "tool_then_answer", "seed": 0},
            "train": {"global_batch_size": 4, "mini_batch_size": 4, "max_steps": 2},
            "algorithm": {"group_size": 2},
            "sampling": {"max_new_tokens": 8},
            "inference": {"max_total_tokens": 4096, "weight_sync": "collective"},
            "async": {"staleness_threshold": 1, "queue_max_size": 32, "trigger_batch_size": 4},
            "agent": {"reward_source": "agent", "concurrency": 4, "episode_timeout_s": 60},
            "logging": {"log_dir": str(tmp_path / "logs"), "save_interval": 100},
        }
    )
    summary = train(config, tmp_path / "out")
    assert summary.steps == 2 and summary.version == 2
    syncs = [
        line for line in (tmp_path / "logs" / "train.log").read_text().splitlines()
        if line.startswith("[sync]")
    ]  # fmt: skip
    assert len(syncs) == 2 and "join_seconds=" in syncs[0] and "join_seconds=" not in syncs[1]
    assert not (tmp_path / "out" / "weights").exists() or not any(
        (tmp_path / "out" / "weights").iterdir()
    )
