"""The in-process gateway: a real gateway app on a server thread on 127.0.0.1, in front of a real
engine, for every test that talks to the gateway over HTTP without starting a process.

``tests/gateway/conftest.py`` builds its fixtures from these; a test module that needs a gateway
with other settings (no engine, an upstream channel, a proxy in front of the engine) builds it
from :func:`router` and :func:`running_gateway` here, never from a copy.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import httpx
from aiohttp import web

from areal.core.types import Trajectory
from areal.gateway.app import build_app
from areal.gateway.gateway_state import GatewayState
from areal.gateway.router_config import RouterConfig
from areal.gateway.server import build_state
from areal.host.http_server import ServerThread
from areal.plugins.inference.embedded.server import InferenceServer
from support.http import bearer

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
    engine_url: str = ""  # where the gateway sends the policy's calls

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run ``coro`` on the gateway's own event loop (its engine clients live there)."""
        assert self.http is not None and self.http.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.http.loop).result(timeout)

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def headers(self, key: str | None = None) -> dict[str, str]:
        return bearer(key or self.key)

    def open_session(
        self, body: dict[str, Any] | None = None, prefix: str = "/rl"
    ) -> dict[str, Any]:
        """``POST /rl/sessions`` with the admin token; the new session's id and key."""
        resp = httpx.post(
            f"{self.url}{prefix}/sessions", json=body or {}, headers=bearer(self.admin)
        )
        assert resp.status_code == 200, resp.text
        opened: dict[str, Any] = resp.json()
        assert set(opened) == {"session_id", "api_key"}, opened
        return opened

    def engine_stats(self) -> dict[str, Any]:
        """The embedded engine's own counters (``running``, ``tokens_generated`` ...)."""
        return dict(self.engine.engine.stats())


def router(overrides: dict[str, Any] | None = None) -> RouterConfig:
    """The test router: the policy ``areal-tiny`` (256 tokens at most), plus ``overrides``."""
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
        router(config), [engine_url], gateway_key=GATEWAY_KEY, log_dir=log_dir, **options
    )
    http = ServerThread(build_app(state), "127.0.0.1", 0).start()
    try:
        yield RunningGateway(http.url, state, log_dir, engine, http=http, engine_url=engine_url)
    finally:
        http.stop()


@contextmanager
def engine_paused(engine_url: str) -> Iterator[None]:
    """The engine at ``engine_url`` keeps its calls but decodes no token until the block ends: a
    call that must still be running when the test acts (a detach, a drain) is held there by
    this, not by being long enough for the machine's speed."""
    paused = httpx.post(f"{engine_url}/pause_generation", json={"mode": "in_place"}, timeout=30)
    assert paused.status_code == 200, paused.text
    try:
        yield
    finally:
        resumed = httpx.post(f"{engine_url}/continue_generation", json={}, timeout=30)
        assert resumed.status_code == 200, resumed.text


def trajectories(log_dir: Path) -> list[Trajectory]:
    """The trajectories the gateway's JSONL sink wrote to ``log_dir``, in order."""
    path = log_dir / "trajectories.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [Trajectory.from_json(json.loads(line)) for line in lines]


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
