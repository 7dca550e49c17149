"""A real gateway in front of a real embedded engine, both on 127.0.0.1, for the gateway tests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from aiohttp import web

from areal.gateway.app import build_app
from areal.gateway.gateway_state import GatewayState
from areal.gateway.router_config import RouterConfig
from areal.gateway.server import build_state
from areal.host.http_server import ServerThread
from areal.plugins.inference.embedded.server import InferenceServer, build_server
from areal.plugins.models.tiny import init_tiny

GATEWAY_KEY = "test-gateway-key-0123456789"
ADMIN_TOKEN = "test-admin-token-0123456789"
POLICY = "areal-tiny"
T = TypeVar("T")


@dataclass
class RunningGateway:
    url: str  # http://127.0.0.1:PORT (clients add /v1 themselves)
    state: GatewayState
    log_dir: Path
    engine: InferenceServer
    key: str = GATEWAY_KEY
    admin: str = ADMIN_TOKEN
    model: str = POLICY
    http: ServerThread | None = None

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run ``coro`` on the gateway's own event loop (its engine clients live there)."""
        assert self.http is not None and self.http.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.http.loop).result(timeout)

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def headers(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.key}"}


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


def _router(overrides: dict[str, Any] | None) -> RouterConfig:
    data: dict[str, Any] = {
        "model_routing": {"policy_model": {"model_id": POLICY, "max_tokens": 256}}
    }
    data.update(overrides or {})
    return RouterConfig.model_validate(data)


@contextmanager
def running_gateway(
    engine_url: str,
    engine: InferenceServer,
    log_dir: Path,
    config: dict[str, Any] | None = None,
    **options: Any,
) -> Iterator[RunningGateway]:
    """``options`` go to ``build_state`` (e.g. ``admin_token=None``, ``budget=...``)."""
    options = {"admin_token": ADMIN_TOKEN, **options}
    state = build_state(
        _router(config), [engine_url], gateway_key=GATEWAY_KEY, log_dir=log_dir, **options
    )
    http = ServerThread(build_app(state), "127.0.0.1", 0).start()
    try:
        yield RunningGateway(http.url, state, log_dir, engine, http=http)
    finally:
        http.stop()


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


@dataclass
class EngineRecorder:
    """A pass-through proxy in front of the real engine that keeps every ``/generate`` body, so a
    test sees exactly what the gateway asked of the engine (prompt ids, grammar) while the
    generations stay the engine's own."""

    engine_url: str
    generate_bodies: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_route("*", "/{path:.*}", self.forward)
        return app

    async def forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.path == "/generate" and body:
            self.generate_bodies.append(json.loads(body))
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with (
            aiohttp.ClientSession() as http,
            http.request(
                request.method, self.engine_url + request.path_qs, data=body, headers=headers
            ) as answer,
        ):
            response = web.StreamResponse(
                status=answer.status,
                headers={"Content-Type": answer.headers.get("Content-Type", "application/json")},
            )
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response


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
