"""Fixtures for the gateway tests: one real embedded engine per test session, and in-process
gateways in front of it (:mod:`support.gateway` builds them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from areal.host.http_server import ServerThread
from areal.plugins.inference.embedded.server import InferenceServer, build_server
from areal.plugins.models.tiny import init_tiny
from support.gateway import EngineRecorder, RunningGateway, running_gateway


@pytest.fixture(scope="session")
def gateway_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("gateway-model") / "nano"
    init_tiny(path, size="nano", seed=0)
    return str(path)


@pytest.fixture(scope="session")
def engine(gateway_model_dir: str) -> Iterator[tuple[str, InferenceServer]]:
    """The real embedded engine on 127.0.0.1, shared by every gateway test."""
    server = build_server(gateway_model_dir, max_total_tokens=16384)
    http = server.http().start()
    try:
        yield http.url, server
    finally:
        server.engine.stop()
        http.stop()


@pytest.fixture(scope="session")
def tokenizer(gateway_model_dir: str) -> Any:
    """The policy's tokenizer, to count and render prompts as the gateway does."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gateway_model_dir)


@pytest.fixture(scope="module")
def gateway(
    engine: tuple[str, InferenceServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    """A gateway shared by a test module (the policy only, no upstream channel)."""
    with running_gateway(*engine, tmp_path_factory.mktemp("gateway-logs")) as gw:
        yield gw


@pytest.fixture
def start_gateway(
    engine: tuple[str, InferenceServer], tmp_path: Path
) -> Callable[..., AbstractContextManager[RunningGateway]]:
    """A private gateway with router overrides, e.g. ``start_gateway(config={"api_gateway": {...}})``,
    and ``build_state`` options, e.g. ``start_gateway(budget=StalenessBudget(...))``."""
    return lambda config=None, **options: running_gateway(*engine, tmp_path, config, **options)


@pytest.fixture(scope="module")
def recorded_gateway(
    engine: tuple[str, InferenceServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningGateway, EngineRecorder]]:
    """A gateway whose engine calls pass through an :class:`EngineRecorder`."""
    url, server = engine
    recorder = EngineRecorder(url)
    proxy = ServerThread(recorder.app(), "127.0.0.1", 0).start()
    try:
        with running_gateway(proxy.url, server, tmp_path_factory.mktemp("recorded-logs")) as gw:
            yield gw, recorder
    finally:
        proxy.stop()
