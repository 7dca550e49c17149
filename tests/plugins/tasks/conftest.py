"""A nano model before and after a short format warm start, served by a real embedded engine
behind a real gateway on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from areal.gateway.app import build_app
from areal.gateway.router_config import RouterConfig
from areal.gateway.server import build_state
from areal.host.http_server import ServerThread
from areal.plugins.inference.embedded.server import build_server
from areal.plugins.models.tiny import init_tiny
from areal.plugins.trainer.warm_start import warm_start

ADMIN_TOKEN = "tasks-test-admin-token-0123456789"
GATEWAY_KEY = "tasks-test-gateway-key-0123456789"
POLICY = "areal-nano"


@dataclass
class Served:
    url: str  # the gateway, without /v1
    log_dir: Path
    admin: str = ADMIN_TOKEN
    model: str = POLICY


@pytest.fixture(scope="session")
def nano_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("tasks-nano") / "base"
    init_tiny(path, size="nano", seed=0)
    return path


@pytest.fixture(scope="session")
def warm_nano_dir(nano_dir: Path) -> Path:
    """Enough format for greedy decoding to follow it (not for sampling to, always)."""
    return warm_start(
        nano_dir,
        nano_dir.parent / "warm",
        task_set="tool_then_answer",
        steps=60,
        learning_rate=5e-3,
    )


@pytest.fixture(scope="session")
def warm_calculator_dir(nano_dir: Path) -> Path:
    """The calculator's format: sampled at temperature 1, turn 1 names one of the keys most of
    the time, ``square`` about one time in seven (measured: 10 of 64)."""
    return warm_start(
        nano_dir,
        nano_dir.parent / "warm-calculator",
        task_set="calculator",
        steps=60,
        learning_rate=5e-3,
    )


@pytest.fixture
def serve() -> Callable[..., AbstractContextManager[Served]]:
    """``with serve(model_dir, log_dir, temperature=...) as served:`` a fresh engine + gateway."""
    return serving


@contextmanager
def serving(model_dir: Path, log_dir: Path, temperature: float) -> Iterator[Served]:
    server = build_server(str(model_dir), max_total_tokens=16384)
    engine = ServerThread(server.app(), "127.0.0.1", 0).start()
    route = {"model_id": POLICY, "temperature": temperature, "max_tokens": 256}
    config = RouterConfig.model_validate({"model_routing": {"policy_model": route}})
    state = build_state(
        config, [engine.url], gateway_key=GATEWAY_KEY, admin_token=ADMIN_TOKEN, log_dir=log_dir
    )
    gateway = ServerThread(build_app(state), "127.0.0.1", 0).start()
    try:
        yield Served(gateway.url, log_dir)
    finally:
        gateway.stop()
        server.engine.stop()
        engine.stop()
