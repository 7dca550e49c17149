"""The admin API client against a real gateway (and its real nano engine) on 127.0.0.1: every
method, the typed errors (a wrong token names AREAL_ADMIN_TOKEN, a gateway that is down or slow
names the cause, a full budget surfaces 429 with its Retry-After), and ``best_effort``."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from aiohttp import web

from areal.core.staleness import StalenessBudget
from areal.core.types import Trajectory
from areal.gateway.app import build_app
from areal.gateway.router_config import RouterConfig
from areal.gateway.server import build_state
from areal.host.http_server import ServerThread
from areal.host.process import pick_free_port
from areal.plugins.models.tiny import init_tiny
from areal.run.gateway_client import (
    GatewayAdmin,
    GatewayAdminError,
    GatewayBusy,
    GatewayRefused,
    GatewayUnauthorized,
    GatewayUnreachable,
    best_effort,
    retry_after,
)

ADMIN = "client-admin-token-0123456789"
KEY = "client-gateway-key-0123456789"
POLICY = "areal-nano"
T = TypeVar("T")


def run(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await coro

    return asyncio.run(main())


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory: pytest.TempPathFactory, serve_embedded: Any) -> Iterator[str]:
    path = tmp_path_factory.mktemp("client-model") / "nano"
    init_tiny(path, size="nano", seed=0)
    with serve_embedded(str(path)) as url:
        yield url


@contextlib.contextmanager
def gateway(engine_url: str, log_dir: Path, **options: Any) -> Iterator[str]:
    """A real gateway; ``options`` go to ``build_state`` (``budget=``, ``admin_token=None``)."""
    route = {"model_id": POLICY, "max_tokens": 8}
    config = RouterConfig.model_validate({"model_routing": {"policy_model": route}})
    options = {"admin_token": ADMIN, **options}
    state = build_state(config, [engine_url], gateway_key=KEY, log_dir=log_dir, **options)
    http = ServerThread(build_app(state), "127.0.0.1", 0).start()
    try:
        yield http.url
    finally:
        http.stop()


@pytest.fixture
def url(engine_url: str, tmp_path: Path) -> Iterator[str]:
    with gateway(engine_url, tmp_path) as gw:
        yield gw


async def chat(url: str, key: str) -> str:
    """One policy call with a session's key; the completion's id."""
    body = {"model": POLICY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as resp,
    ):
        assert resp.status == 200, await resp.text()
        return str((await resp.json())["id"])


def trajectories(log_dir: Path) -> list[Trajectory]:
    lines = (log_dir / "trajectories.jsonl").read_text().splitlines()
    return [Trajectory.from_json(json.loads(line)) for line in lines]


def test_an_episode_open_reward_trace_end(url: str, tmp_path: Path) -> None:
    async def episode() -> None:
        async with GatewayAdmin(url, ADMIN) as admin:
            opened = await admin.open_session(metadata={"worker": "0"}, task_id="t-1", wait_s=1.0)
            sid = opened["session_id"]
            completion = await chat(url, opened["api_key"])
            turn = await admin.reward(sid, 0.25, completion_id=completion)
            assert turn == {"session_id": sid, "completion_id": completion, "reward": 0.25}
            assert (await admin.reward(sid, 2))["completion_id"] is None
            trace = await admin.trace(sid)
            assert (trace["session_id"], trace["policy_model"]) == (sid, POLICY)
            assert [c["status"] for c in trace["calls"]] == [200] and len(trace["turns"]) == 1
            status = await admin.session(sid)
            assert status["status"] == "open" and status["turn_rewards"] == {completion: 0.25}
            ended = await admin.end(sid, reward=1.0)
            assert ended["sent"] is True and (ended["completions"], ended["reward"]) == (1, 1.0)
            with pytest.raises(GatewayRefused, match="has ended") as err:
                await admin.end(sid)
            assert (err.value.status, err.value.code) == (409, "session_ended")
            with pytest.raises(GatewayRefused, match="trace a session before ending it"):
                await admin.trace(sid)

    run(episode())
    (traj,) = trajectories(tmp_path)
    assert traj.metadata == {"worker": "0", "task_id": "t-1"} and traj.reward == 1.0
    assert traj.turns[0].reward == 0.25


def test_discarded_ends_and_the_run_routes(url: str) -> None:
    async def calls() -> None:
        admin = GatewayAdmin(url, ADMIN)  # no session held: one per call
        kept = await admin.open_session(api_key="fixed-episode-key-0123456789")
        assert kept["api_key"] == "fixed-episode-key-0123456789"
        gone = [await admin.open_session(metadata={"worker": "3"}) for _ in range(2)]
        status = await admin.status()
        assert sorted(status["open"]) == sorted(
            [kept["session_id"], *(g["session_id"] for g in gone)]
        )
        assert status["open_by_worker"] == {"3": 2} and status["budget"]["running"] == 3
        discarded = await admin.discard(metadata={"worker": "3"})
        assert sorted(discarded["session_ids"]) == sorted(g["session_id"] for g in gone)
        assert discarded["discarded"] == 2
        ended = await admin.end(kept["session_id"], discard=True)
        assert ended["sent"] is False
        assert await admin.set_version(2) == await admin.version()
        assert (await admin.set_version(1, dropped=0))["version"] == 2  # never moves back
        assert (await admin.status())["discarded"] == 2
        assert await best_effort(admin.version()) == await admin.version()  # passes answers on

    run(calls())


def test_engines_detach_attach_and_list(url: str, engine_url: str) -> None:
    async def calls() -> None:
        async with GatewayAdmin(url, ADMIN) as admin:
            listed = await admin.engines()
            assert listed["policy"] == POLICY
            assert [e["url"] for e in listed["engines"]] == [engine_url]
            gone = await admin.detach_engine(engine_url, drain=True, timeout=5)
            assert gone == {"detached": engine_url, "finished": 0, "aborted": 0}
            assert (await admin.engines())["engines"] == []
            with pytest.raises(GatewayRefused) as missing:
                await admin.detach_engine(engine_url)
            assert (missing.value.status, missing.value.code) == (404, "engine_not_found")
            entry = await admin.attach_engine(engine_url + "/", backend="embedded", owner="t-1")
            assert (entry["url"], entry["backend"], entry["owner"]) == (
                engine_url,
                "embedded",
                "t-1",
            )
            assert entry["healthy"] and entry["weight_version"] is not None
            [again] = (await admin.engines())["engines"]
            assert again["url"] == engine_url and again["owner"] == "t-1"
            dead = f"http://127.0.0.1:{pick_free_port()}"
            with pytest.raises(GatewayRefused, match="cannot be attached") as refused:
                await admin.attach_engine(dead)
            assert refused.value.code == "engine_unreachable"

    run(calls())


def test_a_full_budget_is_a_429_with_its_retry_after(engine_url: str, tmp_path: Path) -> None:
    budget = StalenessBudget(max_concurrent=1, retry_after_s=2.5)

    async def calls() -> None:
        async with GatewayAdmin(url, ADMIN) as admin:
            first = await admin.open_session()
            with pytest.raises(GatewayBusy) as busy:
                await admin.open_session(wait_s=0.2)
            assert (busy.value.status, busy.value.code) == (429, "staleness_budget_full")
            assert busy.value.retry_after == 3.0 and "retry after 3s" in str(busy.value)
            await admin.end(first["session_id"])
            assert (await admin.open_session())["session_id"] != first["session_id"]  # retried

    with gateway(engine_url, tmp_path, budget=budget) as url:
        run(calls())


def test_a_wrong_token_names_the_variable(url: str) -> None:
    for token in ("not-the-admin-token", KEY):  # 401; 403 (a gateway key is not the admin's)
        admin = GatewayAdmin(url, token)
        with pytest.raises(GatewayUnauthorized, match="AREAL_ADMIN_TOKEN") as err:
            run(admin.status())
        assert err.value.status in (401, 403) and err.value.call == "GET /rl/sessions"
        assert token not in str(err.value) and token not in repr(admin)
        assert run(best_effort(admin.set_version(1))) is None


def test_a_gateway_without_the_session_api_says_how_to_turn_it_on(
    engine_url: str, tmp_path: Path
) -> None:
    with (
        gateway(engine_url, tmp_path, admin_token=None) as url,
        pytest.raises(GatewayRefused, match="set AREAL_ADMIN_TOKEN") as err,
    ):
        run(GatewayAdmin(url, ADMIN).open_session())
    assert (err.value.status, err.value.code) == (404, "session_api_off")


def test_a_server_that_is_not_a_gateway(engine_url: str) -> None:
    with pytest.raises(GatewayRefused, match=r"refused GET /rl/version \(HTTP 404\)"):
        run(GatewayAdmin(engine_url, ADMIN).version())


def test_a_gateway_that_is_down_names_the_cause() -> None:
    url = f"http://127.0.0.1:{pick_free_port()}"
    admin = GatewayAdmin(url, ADMIN)
    with pytest.raises(GatewayUnreachable, match="cannot reach the gateway at") as err:
        run(admin.open_session(wait_s=1.0))
    assert isinstance(err.value.cause, aiohttp.ClientConnectionError)
    assert url in str(err.value) and "POST /rl/sessions" in str(err.value)
    assert type(err.value.cause).__name__ in str(err.value)
    assert run(best_effort(admin.status())) is None


def test_a_gateway_that_does_not_answer_in_time() -> None:
    async def silent(request: web.Request) -> web.Response:
        await asyncio.Event().wait()  # never answers (cancelled when the client gives up)
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/rl/sessions", silent)
    server = ServerThread(app, "127.0.0.1", 0, handler_cancellation=True).start()
    try:
        with pytest.raises(GatewayUnreachable, match="Timeout"):
            run(GatewayAdmin(server.url, ADMIN, timeout_s=0.3).status())
    finally:
        server.stop()


def test_an_answer_that_is_not_json_is_an_admin_error() -> None:
    app = web.Application()
    app.router.add_get("/rl/version", _text)
    server = ServerThread(app, "127.0.0.1", 0).start()
    try:

        async def through_own_session() -> None:
            async with aiohttp.ClientSession() as http:
                await GatewayAdmin(server.url, ADMIN, http=http).version()

        with pytest.raises(GatewayAdminError, match="failed on GET /rl/version"):
            run(through_own_session())
    finally:
        server.stop()


async def _text(request: web.Request) -> web.Response:
    return web.Response(text="hello")


def test_retry_after_values() -> None:
    assert [retry_after(v) for v in ("3", "0.5", None, "soon", "0")] == [3.0, 0.5, 1.0, 1.0, 0.1]
