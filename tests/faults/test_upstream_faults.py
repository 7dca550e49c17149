"""The upstream channel failing in every way a remote API fails, seen through the official
OpenAI and Anthropic SDKs: a real gateway on 127.0.0.1 in front of a real HTTP upstream on
127.0.0.1 that answers 401, 403, 429 (with ``Retry-After``), 5xx, hangs, resets the connection
and cuts SSE streams short, as told per model id.

What must hold: retries with capped exponential backoff and jitter (honouring ``Retry-After``)
while nothing has reached the client; otherwise the protocol's own error, a streamed one for a
stream that already started, never a silent end; and one ``gateway.log`` line per request saying
what each attempt came to, the channel and the attempt count, without the key.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from aiohttp import web

from areal.gateway.app import build_app
from areal.gateway.router_config import ApiGatewayConfig, RouterConfig
from areal.gateway.server import build_state
from areal.gateway.upstream import StreamEnd, UpstreamChannel, _Failure
from areal.host.http_server import ServerThread
from support import eventually

GATEWAY_KEY = "faults-gateway-key-0123456789"
KEY_VAR = "AREAL_FAULTS_UPSTREAM_KEY"
UPSTREAM_KEY = "faults-upstream-" + secrets.token_hex(12)  # no sk- prefix: no pattern hides it
TIMEOUT_S = 1.0
MAX_RETRIES = 2
BACKOFF, BACKOFF_MAX = 0.05, 0.2
# One model id per scenario, each listed in the router (unlisted ids are never forwarded).
MODELS = (
    "ok",
    "rate-limited",
    "rate-limited-long",
    "server-errors",
    "server-down",
    "reset-once",
    "reset-always",
    "reset-after-headers",
    "refused",
    "forbidden",
    "hangs",
    "hangs-once",
    "cut-openai",
    "dropped-openai",
    "stalled-openai",
    "cut-anthropic",
    "cut-responses",
    "whole-anthropic",
)


# --- the upstream: a remote API that fails on cue ---------------------------------------------


@dataclass
class FaultyUpstream:
    """Answers each model id's calls by its plan, one step per call (the last step repeats):
    ``ok``, an HTTP status (``429`` or ``429@0.3`` for ``Retry-After: 0.3``), ``reset`` (a TCP
    reset before any byte), ``reset-after-headers`` (200 and SSE headers, then a reset), ``hang``,
    and for streams ``cut`` (two events, then a clean end without the last event), ``drop`` (two
    events, then the connection closes mid-body) and ``stall`` (one event, then silence)."""

    plans: dict[str, list[str]] = field(default_factory=dict)
    calls: dict[str, list[float]] = field(default_factory=dict)  # arrival times
    keys: list[str] = field(default_factory=list)  # the credentials it was sent

    def plan(self, model: str, *steps: str) -> None:
        self.plans[model] = list(steps)
        self.calls[model] = []

    def app(self) -> web.Application:
        app = web.Application()
        for path in ("/v1/chat/completions", "/v1/messages", "/v1/responses"):
            app.router.add_post(path, self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        model = str(body.get("model"))
        self.keys.append(request.headers.get("Authorization", ""))
        self.calls.setdefault(model, []).append(time.monotonic())
        steps = self.plans.get(model, ["ok"])
        step = steps.pop(0) if len(steps) > 1 else steps[0]
        api = request.path.rsplit("/", 1)[-1]
        if step == "reset":
            return _reset(request)
        if step == "hang":
            await asyncio.Event().wait()  # never answers (cancelled when the caller gives up)
        if step[0].isdigit():
            status, _, wait = step.partition("@")
            echo = f"invalid key {self.keys[-1][7:]} (ends in ...{self.keys[-1][-8:]})"
            headers = {"Retry-After": wait} if wait else {}
            message = echo if status in ("401", "403") else f"upstream says {status}"
            return web.json_response(
                {"error": {"message": message, "type": "upstream_error"}},
                status=int(status),
                headers=headers,
            )
        if body.get("stream"):
            return await self.stream(request, api, model, step)
        if api == "messages":
            return web.json_response(anthropic_message(model, "whole answer"))
        return web.json_response(chat_completion(model, "whole answer"))

    async def stream(
        self, request: web.Request, api: str, model: str, step: str
    ) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        if step == "reset-after-headers":  # the headers left with prepare(); then the reset
            _reset(request)
            return out
        events = sse_events(api, model)
        keep = {"cut": 2, "drop": 2, "stall": 1}.get(step, len(events))
        for event in events[:keep]:
            await out.write(event)
        if step == "drop":
            assert request.transport is not None
            request.transport.close()  # a FIN in the middle of the chunked body
            return out
        if step == "stall":
            await asyncio.Event().wait()  # silence (cancelled when the caller gives up)
        await out.write_eof()
        return out


def _reset(request: web.Request) -> web.Response:
    """Drop the connection with a TCP reset (SO_LINGER 0), nothing answered."""
    transport = request.transport
    assert transport is not None
    sock = transport.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
    return web.Response()


def chat_completion(model: str, text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-up",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def anthropic_message(model: str, text: str) -> dict[str, Any]:
    return {
        "id": "msg_up",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 2},
    }


def sse_events(api: str, model: str) -> list[bytes]:
    """A whole stream of each protocol, three text parts, ending with its last event."""
    parts = ["part0 ", "part1 ", "part2 "]
    if api == "chat/completions" or api == "completions":
        api = "completions"
    if api == "messages":
        named: list[tuple[str, dict[str, Any]]] = [
            ("message_start", {"type": "message_start", "message": {**anthropic_message(model, ""), "content": []}}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            *[
                ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}})
                for p in parts
            ],
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 3}}),
            ("message_stop", {"type": "message_stop"}),
        ]  # fmt: skip
        return [f"event: {e}\ndata: {json.dumps(d)}\n\n".encode() for e, d in named]
    if api == "responses":
        response = {
            "id": "resp_up",
            "object": "response",
            "model": model,
            "status": "completed",
            "output": [],
        }
        named = [
            ("response.created", {"type": "response.created", "response": {**response, "status": "in_progress"}}),
            *[
                ("response.output_text.delta", {"type": "response.output_text.delta", "item_id": "m1", "output_index": 0, "content_index": 0, "delta": p})
                for p in parts
            ],
            ("response.completed", {"type": "response.completed", "response": response}),
        ]  # fmt: skip
        return [
            f"event: {e}\ndata: {json.dumps({**d, 'sequence_number': i})}\n\n".encode()
            for i, (e, d) in enumerate(named)
        ]
    chunks = [
        {
            "id": "chatcmpl-up",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}],
        }
        for p in parts
    ]
    return [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]


# --- the gateway in front of it ---------------------------------------------------------------


@dataclass
class Rig:
    url: str
    upstream: FaultyUpstream
    host: str  # the channel's name in gateway.log: the upstream's host:port
    log: Path

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=GATEWAY_KEY, max_retries=0)

    def anthropic(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.url, api_key=GATEWAY_KEY, max_retries=0)

    def lines(self, model: str, count: int = 1) -> list[str]:
        """The gateway.log lines of ``model``'s requests, once ``count`` are there (a streamed
        answer's line is written just after its last byte)."""

        def found() -> list[str]:
            text = self.log.read_text() if self.log.exists() else ""
            return [line for line in text.splitlines() if f" model={model} " in line]

        eventually(lambda: len(found()) >= count, 60, f"{count} gateway.log line(s) of {model}")
        return found()

    def line(self, model: str) -> dict[str, str]:
        """The one gateway.log line of ``model``'s request, as its key=value fields."""
        found = self.lines(model)
        assert len(found) == 1, found
        return dict(part.split("=", 1) for part in found[0].split()[1:])


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    upstream = FaultyUpstream()
    up = ServerThread(
        upstream.app(), "127.0.0.1", 0, shutdown_timeout=0.5, handler_cancellation=True
    ).start()
    log_dir = tmp_path_factory.mktemp("faults-gateway")
    roles = {f"model_{i}": {"model_id": m} for i, m in enumerate(MODELS)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(KEY_VAR, UPSTREAM_KEY)
        config = RouterConfig.model_validate(
            {
                "api_gateway": {
                    "base_url": f"{up.url}/v1",
                    "api_key": "${" + KEY_VAR + "}",
                    "timeout": TIMEOUT_S,
                    "max_retries": MAX_RETRIES,
                    "retry_backoff": BACKOFF,
                    "retry_backoff_max": BACKOFF_MAX,
                },
                "model_routing": {"policy_model": {"model_id": "the-policy"}, **roles},
            }
        )
    state = build_state(config, [], gateway_key=GATEWAY_KEY, admin_token=None, log_dir=log_dir)
    gw = ServerThread(build_app(state), "127.0.0.1", 0, shutdown_timeout=0.5).start()
    try:
        yield Rig(gw.url, upstream, up.url.removeprefix("http://"), log_dir / "gateway.log")
    finally:
        gw.stop()
        up.stop()


def ask(model: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"hello {model}"}]


def assert_no_key(text: str) -> None:
    assert UPSTREAM_KEY not in text and UPSTREAM_KEY[-8:] not in text


# --- retried: 429, 5xx, resets, timeouts, while nothing has been sent -------------------------


def test_429_with_retry_after_is_waited_out_then_answered(rig: Rig) -> None:
    rig.upstream.plan("rate-limited", "429@0.4", "ok")
    started = time.monotonic()
    reply = rig.openai().chat.completions.create(model="rate-limited", messages=ask("x"))
    assert reply.choices[0].message.content == "whole answer"
    first, second = rig.upstream.calls["rate-limited"]
    assert second - first >= 0.4 and time.monotonic() - started >= 0.4  # Retry-After, honoured
    line = rig.line("rate-limited")
    assert (line["status"], line["retries"], line["upstream"]) == ("200", "1", "429,200")
    assert line["route"] == rig.host


def test_retry_after_beyond_the_cap_goes_to_the_client(rig: Rig) -> None:
    """Waiting 120 s inside one request is the client's choice: 429 with the hint, at once."""
    rig.upstream.plan("rate-limited-long", "429@120")
    started = time.monotonic()
    with pytest.raises(openai.RateLimitError) as caught:
        rig.openai().chat.completions.create(model="rate-limited-long", messages=ask("x"))
    # At once: one call, and the answer well before the 120 s it was told to wait.
    assert time.monotonic() - started < 60 and len(rig.upstream.calls["rate-limited-long"]) == 1
    assert caught.value.response.headers["retry-after"] == "120"
    error = caught.value.response.json()["error"]
    assert error["code"] == "upstream_rate_limited" and error["type"] == "rate_limit_error"
    assert rig.host in error["message"]
    line = rig.line("rate-limited-long")
    assert (line["status"], line["upstream"], line["error"]) == (
        "429",
        "429",
        "upstream_rate_limited",
    )


def test_5xx_is_retried_with_growing_jittered_backoff(rig: Rig) -> None:
    rig.upstream.plan("server-errors", "500", "503", "ok")
    reply = rig.openai().chat.completions.create(model="server-errors", messages=ask("x"))
    assert reply.choices[0].message.content == "whole answer"
    t0, t1, t2 = rig.upstream.calls["server-errors"]
    # Retry n waits uniform(step/2, step), step = min(max, backoff * 2**n): at least 25 ms, then
    # 50 (the delays' upper ends are proved exactly in test_backoff_is_capped_and_jittered).
    assert t1 - t0 >= BACKOFF / 2, t1 - t0
    assert t2 - t1 >= BACKOFF, t2 - t1
    line = rig.line("server-errors")
    assert (line["status"], line["retries"], line["upstream"]) == ("200", "2", "500,503,200")


def test_5xx_past_the_retries_is_a_502_in_each_schema(rig: Rig) -> None:
    rig.upstream.plan("server-down", "502")
    with pytest.raises(openai.APIStatusError) as caught:
        rig.openai().chat.completions.create(model="server-down", messages=ask("x"))
    assert caught.value.status_code == 502
    error = caught.value.response.json()["error"]
    assert error["code"] == "upstream_error" and f"{MAX_RETRIES + 1} attempts" in error["message"]
    assert "HTTP 502" in error["message"] and "upstream says 502" in error["message"]
    assert len(rig.upstream.calls["server-down"]) == MAX_RETRIES + 1
    line = rig.line("server-down")
    assert (line["status"], line["retries"], line["upstream"]) == ("502", "2", "502,502,502")
    with pytest.raises(anthropic.APIStatusError) as refused:
        rig.anthropic().messages.create(model="server-down", max_tokens=8, messages=ask("x"))
    assert refused.value.status_code == 502
    body = refused.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "api_error"


def test_a_reset_before_any_byte_is_retried(rig: Rig) -> None:
    rig.upstream.plan("reset-once", "reset", "ok")
    reply = rig.openai().chat.completions.create(model="reset-once", messages=ask("x"))
    assert reply.choices[0].message.content == "whole answer"
    line = rig.line("reset-once")
    assert (line["status"], line["retries"], line["upstream"]) == ("200", "1", "reset,200")


def test_resets_past_the_retries_are_a_502(rig: Rig) -> None:
    rig.upstream.plan("reset-always", "reset")
    with pytest.raises(anthropic.APIStatusError) as caught:
        rig.anthropic().messages.create(model="reset-always", max_tokens=8, messages=ask("x"))
    assert caught.value.status_code == 502
    message = caught.value.response.json()["error"]["message"]
    assert "dropped the connection" in message and rig.host in message
    assert rig.line("reset-always")["upstream"] == "reset,reset,reset"


def test_a_stream_reset_before_its_first_byte_is_retried(rig: Rig) -> None:
    """The upstream said 200 and then died: the client has nothing yet, so it is retried."""
    rig.upstream.plan("reset-after-headers", "reset-after-headers", "ok")
    stream = rig.openai().chat.completions.create(
        model="reset-after-headers", messages=ask("x"), stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "part0 part1 part2 "
    line = rig.line("reset-after-headers")
    assert (line["status"], line["upstream"]) == ("200", "reset,200")


def test_a_timeout_is_retried_then_a_504_in_each_schema(rig: Rig) -> None:
    rig.upstream.plan("hangs-once", "hang", "ok")
    reply = rig.openai().chat.completions.create(model="hangs-once", messages=ask("x"))
    assert reply.choices[0].message.content == "whole answer"
    assert rig.line("hangs-once")["upstream"] == "timeout,200"

    rig.upstream.plan("hangs", "hang")
    started = time.monotonic()
    with pytest.raises(anthropic.APIStatusError) as caught:
        rig.anthropic().messages.create(model="hangs", max_tokens=8, messages=ask("x"))
    elapsed = time.monotonic() - started
    assert caught.value.status_code == 504
    body = caught.value.response.json()
    assert body["type"] == "error" and f"within {TIMEOUT_S:g}s" in body["error"]["message"]
    assert elapsed >= (MAX_RETRIES + 1) * TIMEOUT_S  # each attempt waited its whole timeout
    line = rig.line("hangs")
    assert (line["status"], line["upstream"], line["error"]) == (
        "504",
        "timeout,timeout,timeout",
        "upstream_timeout",
    )


# --- not retried: a refused key --------------------------------------------------------------


@pytest.mark.parametrize(("model", "status"), [("refused", "401"), ("forbidden", "403")])
def test_a_refused_key_is_not_retried_and_not_quoted(rig: Rig, model: str, status: str) -> None:
    rig.upstream.plan(model, status)
    with pytest.raises(openai.APIStatusError) as caught:
        rig.openai().chat.completions.create(model=model, messages=ask("x"))
    # 502, not 401: the client's own key is fine; the operator's was refused upstream.
    assert caught.value.status_code == 502
    text = caught.value.response.text
    error = json.loads(text)["error"]
    assert error["code"] == "upstream_auth" and KEY_VAR in error["message"]
    assert f"HTTP {status}" in error["message"] and "invalid key" not in text  # not quoted
    assert_no_key(text)
    assert len(rig.upstream.calls[model]) == 1
    assert rig.upstream.keys[-1] == f"Bearer {UPSTREAM_KEY}"  # (the key did go upstream)
    with pytest.raises(anthropic.APIStatusError) as refused:
        rig.anthropic().messages.create(model=model, max_tokens=8, messages=ask("x"))
    assert refused.value.response.json()["type"] == "error"
    assert_no_key(refused.value.response.text)
    lines = rig.lines(model, count=2)
    assert [line.split(" upstream=")[1].split()[0] for line in lines] == [status, status]
    assert all("retries=0 " in line and "error=upstream_auth " in line for line in lines)


# --- streams that break after their start: an error event, never a silent end ---------------


def test_an_openai_stream_cut_short_ends_with_an_error_chunk(rig: Rig) -> None:
    for model, step in (("cut-openai", "cut"), ("dropped-openai", "drop")):
        rig.upstream.plan(model, step)
        stream = rig.openai().chat.completions.create(model=model, messages=ask("x"), stream=True)
        got = []
        with pytest.raises(openai.APIError) as caught:
            for chunk in stream:
                got.append(chunk.choices[0].delta.content)
        assert got == ["part0 ", "part1 "]
        assert "broke off the stream" in caught.value.message and rig.host in caught.value.message
        assert len(rig.upstream.calls[model]) == 1  # the client had bytes: not retried
        line = rig.line(model)
        assert (line["status"], line["upstream"], line["error"]) == (
            "200",
            "200+truncated",
            "upstream_stream_truncated",
        )


def test_a_stalled_openai_stream_ends_with_an_error_chunk(rig: Rig) -> None:
    rig.upstream.plan("stalled-openai", "stall")
    with httpx.stream(
        "POST",
        f"{rig.url}/v1/chat/completions",
        json={"model": "stalled-openai", "messages": ask("x"), "stream": True},
        headers={"Authorization": f"Bearer {GATEWAY_KEY}"},
        timeout=10,
    ) as resp:
        data = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert "[DONE]" not in data
    error = json.loads(data[-1])["error"]
    assert f"no data for {TIMEOUT_S:g}s" in error["message"] and error["type"] == "server_error"
    assert rig.line("stalled-openai")["upstream"] == "200+stalled"


def test_an_anthropic_stream_cut_short_ends_with_an_error_event(rig: Rig) -> None:
    rig.upstream.plan("cut-anthropic", "cut")
    stream = rig.anthropic().messages.create(
        model="cut-anthropic", max_tokens=8, messages=ask("x"), stream=True
    )
    kinds = []
    with pytest.raises(anthropic.APIStatusError) as caught:
        for event in stream:
            kinds.append(event.type)
    assert kinds == ["message_start", "content_block_start"]
    assert "broke off the stream" in str(caught.value) and "message_stop" in str(caught.value)
    assert rig.line("cut-anthropic")["error"] == "upstream_stream_truncated"


def test_a_responses_stream_cut_short_ends_with_an_error_event(rig: Rig) -> None:
    rig.upstream.plan("cut-responses", "cut")
    with httpx.stream(
        "POST",
        f"{rig.url}/v1/responses",
        json={"model": "cut-responses", "input": "x", "stream": True},
        headers={"Authorization": f"Bearer {GATEWAY_KEY}"},
        timeout=10,
    ) as resp:
        lines = [line for line in resp.iter_lines() if line]
    assert lines[-2] == "event: error"
    event = json.loads(lines[-1].removeprefix("data: "))
    assert event["type"] == "error" and "response.completed" in event["message"]


def test_a_whole_stream_passes_untouched(rig: Rig) -> None:
    rig.upstream.plan("whole-anthropic", "ok")
    with rig.anthropic().messages.stream(
        model="whole-anthropic", max_tokens=8, messages=ask("x")
    ) as stream:
        text = "".join(stream.text_stream)
    assert text == "part0 part1 part2 "
    line = rig.line("whole-anthropic")
    assert (line["upstream"], "error" in line) == ("200", False)


# --- the key, everywhere ----------------------------------------------------------------------


def test_the_key_is_in_no_log_line(rig: Rig) -> None:
    """Whatever ran before (every scenario here leaves its line), and a refusal that quotes the
    key, which this test makes itself so it holds in any order."""
    rig.upstream.plan("ok", "401", "ok")
    with pytest.raises(openai.APIStatusError):
        rig.openai().chat.completions.create(model="ok", messages=ask("x"))
    rig.openai().chat.completions.create(model="ok", messages=ask("x"))
    assert len(rig.lines("ok", count=2)) >= 2
    text = rig.log.read_text()
    assert_no_key(text)
    assert GATEWAY_KEY not in text


# --- the pieces, by themselves ----------------------------------------------------------------


def test_backoff_is_capped_and_jittered() -> None:
    channel = UpstreamChannel(
        ApiGatewayConfig(
            base_url="http://127.0.0.1:9/v1",
            max_retries=20,
            retry_backoff=0.5,
            retry_backoff_max=4.0,
            timeout=60,
        ),
        RouterConfig().model_routing,
    )
    busy = _Failure(503, "", "503")
    for n in range(20):
        step = min(4.0, 0.5 * 2**n)
        delays = [channel._retry_delay(busy, n) for _ in range(20)]
        assert all(d is not None and step / 2 <= d <= step for d in delays), (n, delays)
        assert len(set(delays)) > 1  # jitter: clients that failed together do not retry together
    assert channel._retry_delay(busy, 20) is None  # max_retries
    assert channel._retry_delay(_Failure(429, "", "429", retry_after=7.0), 0) == 7.0
    assert channel._retry_delay(_Failure(429, "", "429", retry_after=61.0), 0) is None
    assert channel._retry_delay(_Failure(401, "", "401"), 0) is None
    assert channel._retry_delay(_Failure(None, "", "reset"), 0) is not None


@pytest.mark.parametrize(
    ("api", "cut"),
    [("chat/completions", 3), ("messages", 6), ("responses", 4)],
)
def test_stream_end_knows_each_protocols_last_event(api: str, cut: int) -> None:
    events = sse_events(api, "m")
    whole, partial = StreamEnd(), StreamEnd()
    raw = b"".join(events)
    for i in range(0, len(raw), 7):  # chunk boundaries fall anywhere, mid-line included
        whole.feed(raw[i : i + 7])
    partial.feed(b"".join(events[:cut]))
    assert whole.done and not partial.done
    error = StreamEnd()
    error.feed(b'data: {"error": {"message": "overloaded"}}\n\n')
    assert error.done
