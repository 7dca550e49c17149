"""Engines attach to and leave a running gateway (``/rl/engines``): the policy answers 503 until
one is attached, calls go only to live engines, and a call its engine lost never becomes a
half-recorded episode. Real gateway, real embedded engine, real clients, all on 127.0.0.1."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from areal.gateway.app import build_app
from areal.gateway.server import build_state
from areal.host.http_server import ServerThread
from areal.host.process import pick_free_port
from areal.plugins.inference.embedded.server import InferenceServer
from support import eventually
from support.gateway import (
    ADMIN_TOKEN,
    GATEWAY_KEY,
    POLICY,
    EngineRecorder,
    engine_paused,
    router,
)
from support.http import bearer

ADMIN = bearer(ADMIN_TOKEN)
LONG = {"max_tokens": 400, "extra_body": {"ignore_eos": True}}


class Bare:
    """A gateway started with no engine, and its admin calls."""

    def __init__(self, url: str, state: Any) -> None:
        self.url, self.state = url, state
        self.http = httpx.Client(base_url=url, timeout=60)

    def attach(self, engine_url: str, **extra: Any) -> httpx.Response:
        return self.http.post("/rl/engines", json={"url": engine_url, **extra}, headers=ADMIN)

    def detach(self, engine_url: str, **extra: Any) -> httpx.Response:
        body = {"url": engine_url, **extra}
        return self.http.request("DELETE", "/rl/engines", json=body, headers=ADMIN)

    def engines(self) -> list[dict[str, Any]]:
        answer = self.http.get("/rl/engines", headers=ADMIN)
        assert answer.status_code == 200, answer.text
        engines: list[dict[str, Any]] = answer.json()["engines"]
        return engines

    def client(self, key: str = GATEWAY_KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0)

    def chat(self, key: str = GATEWAY_KEY, **options: Any) -> Any:
        return self.client(key).chat.completions.create(
            model=POLICY, messages=[{"role": "user", "content": "hello"}], **options
        )

    def open_session(self) -> dict[str, Any]:
        answer = self.http.post("/rl/sessions", json={}, headers=ADMIN)
        assert answer.status_code == 200, answer.text
        opened: dict[str, Any] = answer.json()
        return opened

    def end(self, session_id: str) -> dict[str, Any]:
        answer = self.http.post(
            f"/rl/sessions/{session_id}/end", json={"reward": 1.0}, headers=ADMIN
        )
        assert answer.status_code == 200, answer.text
        ended: dict[str, Any] = answer.json()
        return ended

    def listed(self, engine_url: str) -> dict[str, Any]:
        """The listing's entry for ``engine_url`` (``{}`` when it is not listed)."""
        return next((e for e in self.engines() if e["url"] == engine_url), {})

    def held_running(self, engine_url: str, work: Any) -> tuple[threading.Thread, dict[str, Any]]:
        """``work`` (a policy call) in a thread, once the gateway lists it running on the
        engine; the caller holds the engine paused, so the call cannot end before it acts."""
        thread, out = in_thread(work)
        eventually(
            lambda: self.listed(engine_url).get("running") or out,
            60,
            f"a call running on {engine_url}",
        )
        assert not out, out  # it ran, and has not ended
        return thread, out


@pytest.fixture
def bare(tmp_path: Path) -> Iterator[Bare]:
    state = build_state(
        router(), [], gateway_key=GATEWAY_KEY, admin_token=ADMIN_TOKEN, log_dir=tmp_path
    )
    state.policy.pool.health_every = 0.2  # quick health checks for the tests
    state.policy.pool.down_after = 2
    http = ServerThread(build_app(state), "127.0.0.1", 0).start()
    try:
        yield Bare(http.url, state)
    finally:
        http.stop()


def in_thread(work: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = work()
        except Exception as err:  # the test inspects it
            out["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_without_an_engine_the_policy_answers_503_in_each_schema(bare: Bare) -> None:
    models = bare.client().models.list()
    assert [m.id for m in models.data] == [POLICY]
    with pytest.raises(openai.InternalServerError) as caught:
        bare.chat()
    assert caught.value.status_code == 503
    assert caught.value.response.headers["Retry-After"] == "5"
    error = caught.value.response.json()["error"]
    assert error["code"] == "no_engine" and "POST /rl/engines" in error["message"]
    answer = bare.http.post(
        "/v1/messages",
        json={"model": POLICY, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": GATEWAY_KEY, "anthropic-version": "2023-06-01"},
    )
    assert answer.status_code == 503 and answer.headers["Retry-After"] == "5"
    assert answer.json()["type"] == "error"
    assert answer.json()["error"]["type"] == "overloaded_error"
    assert "no policy engine is attached" in answer.json()["error"]["message"]


def test_attach_serve_list_detach(bare: Bare, engine: tuple[str, InferenceServer]) -> None:
    url = engine[0]
    refused = bare.http.post(
        "/rl/engines", json={"url": url}, headers={"Authorization": f"Bearer {GATEWAY_KEY}"}
    )
    assert refused.status_code == 403
    assert bare.attach("not-a-url").status_code == 400
    dead = f"http://127.0.0.1:{pick_free_port()}"
    unreachable = bare.attach(dead)
    assert (
        unreachable.status_code == 400
        and unreachable.json()["error"]["code"] == "engine_unreachable"
    )
    attached = bare.attach(url + "/", owner="me")
    assert attached.status_code == 201, attached.text
    assert attached.json()["url"] == url and attached.json()["owner"] == "me"
    reply = bare.chat(max_tokens=4)
    assert reply.choices[0].finish_reason in ("stop", "length")
    [listed] = bare.engines()
    assert listed["url"] == url and listed["healthy"] and listed["served"] == 1
    assert listed["weight_version"] is not None
    gone = bare.detach(url)
    assert gone.status_code == 200 and gone.json() == {"detached": url, "finished": 0, "aborted": 0}
    assert bare.detach(url).status_code == 404
    with pytest.raises(openai.InternalServerError):
        bare.chat(max_tokens=4)


def test_detaching_aborts_running_calls_and_their_episode_is_not_trained(
    bare: Bare, engine: tuple[str, InferenceServer]
) -> None:
    url = engine[0]
    assert bare.attach(url).status_code == 201
    session = bare.open_session()
    with engine_paused(url):
        thread, out = bare.held_running(url, lambda: bare.chat(session["api_key"], **LONG))
        gone = bare.detach(url)
    assert gone.json()["aborted"] == 1
    thread.join(60)
    error = out.get("error")
    assert isinstance(error, openai.InternalServerError) and error.status_code == 503, out
    ended = bare.end(session["session_id"])
    assert ended["sent"] is False and ended["lost_calls"] == 1


def test_a_draining_engine_finishes_its_calls_first(
    bare: Bare, engine: tuple[str, InferenceServer]
) -> None:
    url = engine[0]
    assert bare.attach(url).status_code == 201
    longest = {"max_tokens": 256, "extra_body": {"ignore_eos": True}}  # the policy's cap
    with engine_paused(url):  # the call cannot finish before the drain has begun
        thread, out = bare.held_running(url, lambda: bare.chat(**longest))
        detach, detached = in_thread(lambda: bare.detach(url, drain=True, timeout=120))
        eventually(lambda: bare.listed(url).get("draining"), 60, f"{url} draining")
        assert not detached  # the drain waits for the call
    detach.join(60)
    assert detached["value"].json() == {"detached": url, "finished": 1, "aborted": 0}
    thread.join(60)
    assert out["value"].usage.completion_tokens == 256


def test_a_stream_cut_by_a_detach_ends_with_an_error_and_its_episode_is_dropped(
    bare: Bare, engine: tuple[str, InferenceServer]
) -> None:
    url = engine[0]
    assert bare.attach(url).status_code == 201
    session = bare.open_session()
    stream = bare.client(session["api_key"]).chat.completions.create(
        model=POLICY, messages=[{"role": "user", "content": "hello"}], stream=True, **LONG
    )
    chunks = iter(stream)
    next(chunks)
    with engine_paused(url):  # the stream cannot end before the detach
        assert bare.detach(url).json()["aborted"] == 1
    with pytest.raises(openai.APIError) as caught:
        for _ in chunks:
            pass
    assert "detached" in str(caught.value)
    ended = bare.end(session["session_id"])
    assert ended["sent"] is False and ended["lost_calls"] == 1


def test_a_dead_engine_gets_no_traffic_and_comes_back_when_it_answers(
    bare: Bare, engine: tuple[str, InferenceServer]
) -> None:
    """Two engines: one behind a proxy that dies and comes back on the same port."""
    direct = engine[0]
    # Port 0: bound at once, so no other process can take it between picking and binding.
    proxy = ServerThread(EngineRecorder(direct).app(), "127.0.0.1", 0).start()
    flaky, port = proxy.url, proxy.port
    assert bare.attach(flaky).status_code == 201 and bare.attach(direct).status_code == 201
    proxy.stop()
    for _ in range(4):  # every call is served: a call that finds the proxy dead moves over
        assert bare.chat(max_tokens=2).choices
    states = {e["url"]: e["healthy"] for e in bare.engines()}
    assert states == {flaky: False, direct: True}
    proxy = ServerThread(EngineRecorder(direct).app(), "127.0.0.1", port).start()
    try:
        eventually(lambda: all(e["healthy"] for e in bare.engines()), 30, "the proxy healthy again")
        served = {e["url"]: e["served"] for e in bare.engines()}
        for _ in range(4):
            bare.chat(max_tokens=2)
        after = {e["url"]: e["served"] for e in bare.engines()}
        assert after[flaky] > served[flaky] and after[direct] > served[direct]
    finally:
        proxy.stop()
