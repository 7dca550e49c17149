"""The unified API channel against a real HTTP upstream on 127.0.0.1.

The remote API (the seed's taotoken.net) cannot be reached from the tests, so a stand-in
aiohttp server plays it: its behaviour is picked by the model name (answer, stream, fail N times,
refuse the key, answer without ``choices``, hang). The channel is driven two ways: directly,
through a small route mounted on a real gateway app (so the real middleware, error schemas and
gateway.log are in the loop), and end to end through ``/v1/chat/completions`` and
``/v1/messages``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from areal.gateway.app import build_app
from areal.gateway.gateway_state import state_of
from areal.gateway.request_body import read_json
from areal.gateway.router_config import ApiGatewayConfig, RouterConfig
from areal.gateway.server import build_state
from areal.gateway.upstream import UpstreamChannel, apply_route, retry_after_seconds
from areal.host.http_server import ServerThread
from areal.host.process import pick_free_port
from areal.plugins.inference.embedded.server import InferenceServer
from support.http import bearer, sse_data

GATEWAY_KEY = "test-gateway-key-upstream-0123"
UPSTREAM_KEY = "sk-upstream-secret-0123456789abcdef"
KEY_VAR = "AREAL_TEST_UPSTREAM_KEY"
POLICY = "areal-tiny"
JUDGE = "stand-in-judge"  # routed with defaults: temperature 0.3, top_p 0.9, max_tokens 128
LOCKSTEP_WAIT_S = 30.0  # how long the stand-in waits for the client to read a chunk


# --- the stand-in for the remote API -------------------------------------------------------


@dataclass
class StandInUpstream:
    """An OpenAI/Anthropic-compatible upstream whose behaviour is picked by the model name:

    ``flaky-<status>-<n>-<tag>`` fails ``n`` times with ``status`` then answers; ``locked``
    refuses the key (401, echoing it, as some providers do); ``empty`` answers 200 without
    ``choices``; ``hang`` never answers; ``lockstep-stream`` sends each chunk only once the test
    has read the one before (:attr:`read`); ``broken-stream`` / ``stall-stream`` break off after
    two chunks, or stall after one; ``retry-after-<s>-<tag>`` answers 429 once with
    ``Retry-After: s``. Anything else answers at once (a stream all at once), echoing what it got.
    """

    requests: list[dict[str, Any]] = field(default_factory=list)
    calls: Counter[str] = field(default_factory=Counter)
    url: str = ""
    # Released by the test for each chunk of ``lockstep-stream`` it has read.
    read: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    released: threading.Event = field(default_factory=threading.Event)  # set at teardown

    async def hold(self) -> None:
        """Answer nothing more until the test is over (``hang``, ``stall-stream``)."""
        await asyncio.to_thread(self.released.wait)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        app.router.add_post("/v1/messages", self.handle)
        return app

    def seen(self, model: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["body"].get("model") == model]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        model = str(body.get("model"))
        self.requests.append({"path": request.path, "headers": dict(request.headers), "body": body})
        n = self.calls[model]
        self.calls[model] += 1
        if model.startswith("flaky-"):
            _, status, times, _tag = model.split("-", 3)
            if n < int(times):
                return web.json_response(
                    {"error": {"message": "busy, try again", "type": "overloaded"}},
                    status=int(status),
                )
        if model.startswith("retry-after-") and n == 0:
            seconds = model.split("-")[2]
            return web.json_response(
                {"error": {"message": "slow down"}}, status=429, headers={"Retry-After": seconds}
            )
        if model == "locked":
            presented = request.headers.get("Authorization", "")
            return web.json_response(
                {"error": {"message": f"Incorrect API key provided: {presented[7:]}"}}, status=401
            )
        if model == "empty":
            return web.json_response(
                {"code": 20012, "msg": "model 'empty' is not available on this account"}
            )
        if model == "hang":
            await self.hold()
        if body.get("stream"):
            return await self.stream(request, model)
        if request.path.endswith("/messages"):
            return web.json_response(
                {
                    "id": "msg_standin",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [{"type": "text", "text": "from the stand-in"}],
                    "stop_reason": "end_turn",
                    "stop_sequence": None,
                    "usage": {"input_tokens": 3, "output_tokens": 4},
                }
            )
        return web.json_response(completion(model, json.dumps(body, sort_keys=True)))

    async def stream(self, request: web.Request, model: str) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        with contextlib.suppress(ConnectionResetError):  # the gateway gave up on a stalled stream
            await self.write_chunks(request, out, model)
        return out

    async def write_chunks(self, request: web.Request, out: web.StreamResponse, model: str) -> None:
        for i in range(5):
            await out.write(f"data: {json.dumps(chunk(model, f'part{i} '))}\n\n".encode())
            if model == "broken-stream" and i == 1:
                assert request.transport is not None
                request.transport.close()  # the upstream dies mid-answer
                return
            if model == "stall-stream":
                await self.hold()
            if model == "lockstep-stream" and not await asyncio.to_thread(
                self.read.acquire, True, LOCKSTEP_WAIT_S
            ):
                # The client never saw this chunk: the gateway held it back.
                await out.write(f"data: {json.dumps(chunk(model, 'NOT RELAYED'))}\n\n".encode())
                break
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()


def completion(model: str, content: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-standin",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
    }


def chunk(model: str, text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-standin",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }


# --- a real gateway with the channel mounted on test routes -------------------------------


@dataclass
class Harness:
    url: str
    log_dir: Path
    upstream: StandInUpstream
    upstream_host: str
    delays: list[float]  # what the "recorded" channel waited between attempts, in seconds

    def headers(self) -> dict[str, str]:
        return bearer(GATEWAY_KEY)

    def forward(self, channel: str, path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(
            f"{self.url}/test/{channel}{path}", json=body, headers=self.headers(), timeout=30
        )

    def stream(
        self, channel: str, path: str, body: dict[str, Any]
    ) -> contextlib.AbstractContextManager[httpx.Response]:
        return httpx.stream(
            "POST",
            f"{self.url}/test/{channel}{path}",
            json=body,
            headers=self.headers(),
            timeout=2 * LOCKSTEP_WAIT_S,
        )

    def log_lines(self, model: str) -> list[str]:
        text = (self.log_dir / "gateway.log").read_text()
        return [line for line in text.splitlines() if f"model={model} " in line]


def forwarder(channel: UpstreamChannel | None) -> Any:
    """A handler that hands its body to a channel (``None``: the gateway's own)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        chosen = channel or state_of(request).upstream
        return await chosen.forward(request, body, "/" + request.match_info["path"])

    return handler


@pytest.fixture(scope="module")
def harness(
    engine: tuple[str, InferenceServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    stand_in = StandInUpstream()
    up = ServerThread(stand_in.app(), "127.0.0.1", 0, shutdown_timeout=0.5).start()
    stand_in.url = up.url
    log_dir = tmp_path_factory.mktemp("upstream-logs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(KEY_VAR, UPSTREAM_KEY)
        config = RouterConfig.model_validate(
            {
                "api_gateway": {
                    "base_url": f"{up.url}/v1",
                    "api_key": "${" + KEY_VAR + "}",
                    "timeout": 5,
                    "max_retries": 2,
                    "retry_backoff": 0.01,
                    "retry_backoff_max": 0.05,
                    # The stand-in's behaviour is picked by the model name: any name goes.
                    "allow_unlisted_models": True,
                },
                "model_routing": {
                    "policy_model": {"model_id": POLICY, "max_tokens": 256},
                    "judge_model": {
                        "model_id": JUDGE,
                        "temperature": 0.3,
                        "top_p": 0.9,
                        "max_tokens": 128,
                    },
                },
            }
        )
    assert config.api_gateway is not None
    quick = UpstreamChannel(
        config.api_gateway.model_copy(update={"timeout": 0.3, "max_retries": 1}),
        config.model_routing,
    )
    nowhere = UpstreamChannel(
        config.api_gateway.model_copy(
            update={"base_url": f"http://127.0.0.1:{pick_free_port()}/v1", "max_retries": 1}
        ),
        config.model_routing,
    )
    # What ``api_key: ${KEY_VAR}`` loads as when KEY_VAR is not set.
    unkeyed = UpstreamChannel(
        config.api_gateway.model_copy(update={"api_key": None}), config.model_routing
    )
    delays: list[float] = []

    async def record_delay(seconds: float) -> None:
        delays.append(seconds)

    recorded = UpstreamChannel(config.api_gateway, config.model_routing, sleep=record_delay)
    state = build_state(
        config, [engine[0]], gateway_key=GATEWAY_KEY, admin_token=None, log_dir=log_dir
    )
    app = build_app(state)
    extra = {"quick": quick, "nowhere": nowhere, "unkeyed": unkeyed, "recorded": recorded}
    app.router.add_post("/test/forward/{path:.*}", forwarder(None))
    for name, channel in extra.items():
        app.router.add_post(f"/test/{name}/{{path:.*}}", forwarder(channel))

    async def close_extra(app: web.Application) -> None:
        for channel in extra.values():
            await channel.close()

    app.on_cleanup.append(close_extra)
    gw = ServerThread(app, "127.0.0.1", 0).start()
    try:
        yield Harness(gw.url, log_dir, stand_in, up.url.removeprefix("http://"), delays)
    finally:
        gw.stop()
        stand_in.released.set()
        up.stop()


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


# --- defaults, caps and credentials --------------------------------------------------------


def test_route_defaults_fill_what_the_client_left_out(harness: Harness) -> None:
    resp = harness.forward("forward", "/chat/completions", chat(JUDGE))
    assert resp.status_code == 200, resp.text
    sent = harness.upstream.seen(JUDGE)[-1]
    assert sent["path"] == "/v1/chat/completions"
    assert (sent["body"]["temperature"], sent["body"]["top_p"]) == (0.3, 0.9)
    assert sent["body"]["max_tokens"] == 128
    # The upstream's answer reaches the client unchanged.
    echoed = json.loads(resp.json()["choices"][0]["message"]["content"])
    assert echoed == sent["body"]


def test_client_values_win_but_max_tokens_is_capped(harness: Harness) -> None:
    resp = harness.forward(
        "forward", "/chat/completions", chat(JUDGE, temperature=1.0, max_tokens=32000)
    )
    assert resp.status_code == 200, resp.text
    body = harness.upstream.seen(JUDGE)[-1]["body"]
    assert body["temperature"] == 1.0 and body["max_tokens"] == 128
    harness.forward("forward", "/chat/completions", chat(JUDGE, max_completion_tokens=50000))
    body = harness.upstream.seen(JUDGE)[-1]["body"]
    assert body["max_completion_tokens"] == 128 and "max_tokens" not in body
    harness.forward("forward", "/chat/completions", chat(JUDGE, max_tokens=16))
    assert harness.upstream.seen(JUDGE)[-1]["body"]["max_tokens"] == 16


def test_unrouted_models_go_as_sent(harness: Harness) -> None:
    resp = harness.forward("forward", "/chat/completions", chat("unrouted-model", max_tokens=9000))
    assert resp.status_code == 200
    assert harness.upstream.seen("unrouted-model")[-1]["body"] == chat(
        "unrouted-model", max_tokens=9000
    )


def test_the_channel_key_goes_upstream_never_the_clients(harness: Harness) -> None:
    harness.forward("forward", "/chat/completions", chat("key-check"))
    headers = harness.upstream.seen("key-check")[-1]["headers"]
    assert headers["Authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert GATEWAY_KEY not in json.dumps(headers)
    resp = harness.forward(
        "forward", "/messages", {"model": JUDGE, "messages": [{"role": "user", "content": "hi"}]}
    )
    assert resp.status_code == 200 and resp.json()["content"][0]["text"] == "from the stand-in"
    sent = harness.upstream.seen(JUDGE)[-1]
    assert sent["path"] == "/v1/messages" and sent["headers"]["x-api-key"] == UPSTREAM_KEY
    assert sent["headers"]["anthropic-version"] and sent["body"]["max_tokens"] == 128


# --- streaming ------------------------------------------------------------------------------


def test_streams_are_relayed_as_they_arrive(harness: Harness) -> None:
    """The stand-in sends each chunk only after the client has read the one before, so a gateway
    that held any chunk back (until the next, or the end) would get no more from it."""
    texts = []
    with harness.stream(
        "forward", "/chat/completions", chat("lockstep-stream", stream=True)
    ) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for data in sse_data(resp):
            if data != "[DONE]":
                texts.append(json.loads(data)["choices"][0]["delta"]["content"])
                harness.upstream.read.release()
    assert texts == [f"part{i} " for i in range(5)]


def test_no_retry_once_a_stream_has_started(harness: Harness) -> None:
    with harness.stream("forward", "/chat/completions", chat("broken-stream", stream=True)) as resp:
        assert resp.status_code == 200
        events = list(sse_data(resp))
    assert len(harness.upstream.seen("broken-stream")) == 1
    assert [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:2]] == [
        "part0 ",
        "part1 ",
    ]
    error = json.loads(events[-1])["error"]
    assert harness.upstream_host in error["message"] and "broke off" in error["message"]


def test_a_stalled_stream_ends_with_an_error_event(harness: Harness) -> None:
    body = {"model": "stall-stream", "stream": True, "messages": []}
    with harness.stream("quick", "/messages", body) as resp:
        lines = list(resp.iter_lines())
    assert "event: error" in lines  # Anthropic's shape for the /messages API
    error = json.loads(lines[lines.index("event: error") + 1][6:])
    assert error["type"] == "error" and "no data for 0.3s" in error["error"]["message"]


# --- retries and errors ---------------------------------------------------------------------


def test_retries_429_and_5xx_then_succeeds(harness: Harness) -> None:
    for status in (429, 503):
        model = f"flaky-{status}-2-ok"
        resp = harness.forward("forward", "/chat/completions", chat(model))
        assert resp.status_code == 200, resp.text
        assert len(harness.upstream.seen(model)) == 3
        line = harness.log_lines(model)[-1]
        assert f"route={harness.upstream_host} " in line
        assert "retries=2 " in line and "status=200 " in line


def test_gives_up_after_max_retries(harness: Harness) -> None:
    resp = harness.forward("forward", "/chat/completions", chat("flaky-503-9-gives-up"))
    assert resp.status_code == 502
    message = resp.json()["error"]["message"]
    assert harness.upstream_host in message and "HTTP 503" in message and "3 attempts" in message
    assert "busy, try again" in message  # the upstream's own words
    assert len(harness.upstream.seen("flaky-503-9-gives-up")) == 3  # 1 + max_retries
    resp = harness.forward("forward", "/chat/completions", chat("flaky-429-9-gives-up"))
    assert resp.status_code == 429 and "rate-limiting" in resp.json()["error"]["message"]


def test_client_errors_are_not_retried(harness: Harness) -> None:
    resp = harness.forward("forward", "/chat/completions", chat("flaky-400-9-bad"))
    assert resp.status_code == 400 and "refused the request" in resp.json()["error"]["message"]
    assert len(harness.upstream.seen("flaky-400-9-bad")) == 1


def test_retry_after_is_honoured(harness: Harness) -> None:
    harness.delays.clear()
    resp = harness.forward("recorded", "/chat/completions", chat("retry-after-1-wait"))
    assert resp.status_code == 200 and harness.delays == [1.0]
    assert len(harness.upstream.seen("retry-after-1-wait")) == 2
    # A wait longer than a request may take is the client's to make: 429 with the upstream's hint.
    harness.delays.clear()
    resp = harness.forward("recorded", "/chat/completions", chat("retry-after-120-long"))
    assert resp.status_code == 429 and resp.headers["Retry-After"] == "120"
    assert harness.delays == [] and len(harness.upstream.seen("retry-after-120-long")) == 1


def test_rejected_key_says_which_variable_holds_it(harness: Harness) -> None:
    resp = harness.forward("forward", "/chat/completions", chat("locked"))
    assert resp.status_code == 502
    message = resp.json()["error"]["message"]
    assert "rejected the API key" in message and KEY_VAR in message
    assert harness.upstream_host in message
    assert UPSTREAM_KEY not in resp.text and UPSTREAM_KEY[10:] not in resp.text
    assert len(harness.upstream.seen("locked")) == 1  # a bad key is not retried
    anthropic = harness.forward("forward", "/messages", {"model": "locked", "messages": []})
    assert anthropic.status_code == 502 and anthropic.json()["type"] == "error"
    assert KEY_VAR in anthropic.json()["error"]["message"]


def test_unset_key_variable_is_named_and_nothing_is_sent(harness: Harness) -> None:
    resp = harness.forward("unkeyed", "/chat/completions", chat("unkeyed-call"))
    assert resp.status_code == 502
    error = resp.json()["error"]
    assert error["code"] == "upstream_key_unset" and error["type"] == "server_error"
    assert f"environment variable {KEY_VAR}, which was not set" in error["message"]
    assert f"export {KEY_VAR}=" in error["message"] and harness.upstream_host in error["message"]
    anthropic = harness.forward(
        "unkeyed", "/messages", {"model": "unkeyed-call", "messages": [], "max_tokens": 8}
    )
    assert anthropic.status_code == 502 and anthropic.json()["type"] == "error"
    assert KEY_VAR in anthropic.json()["error"]["message"]
    assert harness.upstream.seen("unkeyed-call") == []  # the upstream would only refuse it
    assert "status=502" in harness.log_lines("unkeyed-call")[-1]


def test_answer_without_choices_quotes_the_upstream(harness: Harness) -> None:
    resp = harness.forward("forward", "/chat/completions", chat("empty"))
    assert resp.status_code == 502
    message = resp.json()["error"]["message"]
    assert "without 'choices'" in message
    assert "model 'empty' is not available on this account" in message


def test_timeouts_are_retried_then_504(harness: Harness) -> None:
    """``hang`` never answers, so any answer is the channel's own timeout (0.3 s an attempt)."""
    started = time.perf_counter()
    resp = harness.forward("quick", "/chat/completions", chat("hang"))
    elapsed = time.perf_counter() - started
    assert resp.status_code == 504
    message = resp.json()["error"]["message"]
    assert harness.upstream_host in message and "0.3s" in message and "2 attempts" in message
    assert elapsed >= 0.6  # both attempts waited out their timeout
    assert len(harness.upstream.seen("hang")) == 2


def test_unreachable_upstream_names_the_host(harness: Harness) -> None:
    resp = harness.forward("nowhere", "/chat/completions", chat("anything"))
    assert resp.status_code == 502
    message = resp.json()["error"]["message"]
    assert "cannot reach the upstream channel 127.0.0.1:" in message
    assert "api_gateway.base_url" in message and "2 attempts" in message


def test_keys_never_reach_a_log_or_a_file(harness: Harness) -> None:
    harness.forward("forward", "/chat/completions", chat("locked"))
    for path in harness.log_dir.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert UPSTREAM_KEY not in text and GATEWAY_KEY not in text, path
    assert harness.log_lines("locked") and "status=502" in harness.log_lines("locked")[-1]


# --- pure helpers ---------------------------------------------------------------------------


def test_apply_route_per_api() -> None:
    routing = RouterConfig.model_validate(
        {"model_routing": {"judge_model": {"model_id": "j", "max_tokens": 100}}}
    ).model_routing
    route = routing.routes()["j"]
    assert apply_route({"model": "j"}, route, "/responses") == {
        "model": "j",
        "max_output_tokens": 100,
    }
    assert apply_route({"model": "j", "max_tokens": 32000}, route, "/messages")["max_tokens"] == 100
    # No route default for temperature: the client's explicit null goes as sent.
    assert apply_route({"model": "j", "temperature": None}, route, "/chat/completions") == {
        "model": "j",
        "temperature": None,
        "max_tokens": 100,
    }


def test_retry_after_forms() -> None:
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds(None) is None and retry_after_seconds("soon") is None
    future = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    delay = retry_after_seconds(future)
    assert delay is not None and 25 < delay <= 30


def test_channel_needs_no_running_loop_to_be_built() -> None:
    channel = UpstreamChannel(
        ApiGatewayConfig(base_url="https://taotoken.net/api/"), RouterConfig().model_routing
    )
    assert channel.host == "taotoken.net" and channel.base_url == "https://taotoken.net/api"
    asyncio.run(channel.close())


# --- end to end through the real protocol routes -------------------------------------------


def test_openai_sdk_through_the_channel(harness: Harness) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{harness.url}/v1", api_key=GATEWAY_KEY, max_retries=0)
    reply = client.chat.completions.create(
        model=JUDGE, messages=[{"role": "user", "content": "judge this"}], max_tokens=4000
    )
    sent = json.loads(reply.choices[0].message.content or "{}")
    assert sent["max_tokens"] == 128 and sent["temperature"] == 0.3
    assert reply.usage is not None and reply.usage.total_tokens == 12
    stream = client.chat.completions.create(
        model="plain-stream", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "part0 part1 part2 part3 part4 "
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="locked", messages=[{"role": "user", "content": "x"}])
    assert err.value.status_code == 502 and KEY_VAR in str(err.value)
    assert any(f"route={harness.upstream_host}" in line for line in harness.log_lines(JUDGE))


def test_anthropic_sdk_through_the_channel(harness: Harness) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=harness.url, api_key=GATEWAY_KEY, max_retries=0)
    reply = client.messages.create(
        model=JUDGE, max_tokens=8000, messages=[{"role": "user", "content": "judge this"}]
    )
    assert reply.content[0].type == "text" and reply.content[0].text == "from the stand-in"
    sent = harness.upstream.seen(JUDGE)[-1]
    assert sent["path"] == "/v1/messages" and sent["body"]["max_tokens"] == 128


def test_the_policy_is_not_sent_upstream(harness: Harness) -> None:
    resp = httpx.post(
        f"{harness.url}/v1/chat/completions",
        json=chat(POLICY, max_tokens=4),
        headers=harness.headers(),
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    assert not harness.upstream.seen(POLICY)
    assert "route=local" in harness.log_lines(POLICY)[-1]


def test_environment_is_left_as_found() -> None:
    assert KEY_VAR not in os.environ
