"""The run's tests share one way to serve a model (the embedded engine's real HTTP server on
127.0.0.1, in a thread of the test process), the nano model the loop tests train and serve, and
one way to hand the trainer loop trajectories (the real ZeroMQ trajectory queue)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

import pytest
import torch

from areal.core.types import Trajectory
from areal.host.http_server import ServerThread
from areal.plugins.inference.embedded.server import build_server
from areal.plugins.models.tiny import init_tiny
from areal.plugins.queues.zmq_queue import ZmqTrajectorySink, ZmqTrajectorySource


@contextlib.contextmanager
def _serve(model_dir: str, **options: Any) -> Iterator[str]:
    server = build_server(model_dir, max_total_tokens=4096, **options)
    http = ServerThread(server.app(), "127.0.0.1", 0).start()
    try:
        yield http.url
    finally:
        server.engine.stop()
        http.stop()


@pytest.fixture(scope="session")
def serve_embedded() -> Callable[..., contextlib.AbstractContextManager[str]]:
    """``with serve_embedded(model_dir) as url:`` an embedded engine serving ``model_dir``."""
    return _serve


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """areal's nano model (random, seed 0): the loop tests' policy and served model."""
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("nano") / "model"
    init_tiny(path, size="nano", seed=0)
    return str(path)


@pytest.fixture
def engine_url(model_dir: str) -> Iterator[str]:
    """An embedded engine serving :func:`model_dir`, for one test."""
    with _serve(model_dir) as url:
        yield url


@contextlib.asynccontextmanager
async def _queued(trajectories: Iterable[Trajectory]) -> AsyncIterator[ZmqTrajectorySource]:
    with ZmqTrajectorySource("tcp://127.0.0.1:*") as source:
        sink = ZmqTrajectorySink(source.address)
        for trajectory in trajectories:
            await sink.put(trajectory)  # returns once the queue holds it
        await sink.close()
        yield source


@pytest.fixture(scope="session")
def queued() -> Callable[..., contextlib.AbstractAsyncContextManager[ZmqTrajectorySource]]:
    """``async with queued(trajectories) as source:`` a real trajectory queue already holding
    ``trajectories``, in order."""
    return _queued
