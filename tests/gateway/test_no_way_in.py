"""No way in: what the gateway refuses, against real gateways on 127.0.0.1.

- a model id the router does not list is not forwarded with the operator's key: 404
  ``model_not_found`` in the protocol's schema, naming the known ids (unless
  ``allow_unlisted_models: true``);
- every ``/rl`` route needs the admin token (the few that take the gateway key are listed here
  by name, so a new route cannot slip through unnoticed), and there is no default admin token;
- a session's key dies with its session;
- headers and bodies past the limits get 431 / 413 / 408 in schema; idle and half-sent
  connections do not starve the others, and are closed;
- binding to a non-loopback address needs ``--allow-remote``; given a certificate, it is HTTPS.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from aiohttp import web

from areal.gateway.app import build_app
from areal.gateway.middleware import HttpLimits, is_rl_path
from areal.gateway.router_config import RouterConfig
from areal.gateway.server import OnlineSettings, build_state
from areal.host.bind import is_loopback, remote_bind_refusal
from areal.host.http_server import ServerThread
from areal.host.process import ServerProcess, pick_free_port, start_on_free_port, with_port
from support import eventually

ROOT = Path(__file__).resolve().parents[2]
ROUTER = str(ROOT / "configs" / "router.yaml")
GATEWAY_KEY = "no-way-in-gateway-key-0123"
ADMIN_TOKEN = "no-way-in-admin-token-0123"
UPSTREAM_KEY = "no-way-in-upstream-key-0123"
LIMITS = HttpLimits(max_body_bytes=64 * 1024, body_timeout_s=0.5, idle_timeout_s=2.0, linger_s=0.5)
KNOWN = ("the-policy", "judge-1", "reward-1")


# --- a gateway (no engine: nothing here reaches the policy) and an upstream that counts -------


class CountingUpstream:
    def __init__(self) -> None:
        self.models: list[str] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/{path:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.models.append(body["model"])
        if request.path.endswith("/messages"):
            return web.json_response(
                {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": body["model"],
                    "content": [{"type": "text", "text": "forwarded"}],
                    "stop_reason": "end_turn",
                    "stop_sequence": None,
                    "usage": {"input_tokens": 1, "output_tokens": 1},
                }
            )
        message = {"role": "assistant", "content": "forwarded"}
        return web.json_response(
            {
                "id": "c1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            }
        )


@dataclass
class Gateway:
    url: str
    app: web.Application
    upstream: CountingUpstream
    http: httpx.Client

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def call(
        self, method: str, path: str, key: str | None = GATEWAY_KEY, **kw: Any
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        headers.update(kw.pop("headers", {}))
        return self.http.request(method, self.url + path, headers=headers, timeout=10, **kw)

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=GATEWAY_KEY, max_retries=0)

    def anthropic(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.url, api_key=GATEWAY_KEY, max_retries=0)


@contextlib.contextmanager
def gateway(*, allow_unlisted: bool = False, admin: str | None = ADMIN_TOKEN) -> Iterator[Gateway]:
    upstream = CountingUpstream()
    up = ServerThread(upstream.app(), "127.0.0.1", 0).start()
    config = RouterConfig.model_validate(
        {
            "api_gateway": {
                "base_url": up.url + "/v1",
                "api_key": UPSTREAM_KEY,
                "allow_unlisted_models": allow_unlisted,
            },
            "model_routing": {
                "policy_model": {"model_id": KNOWN[0]},
                "judge_model": {"model_id": KNOWN[1]},
                "reward_model": {"model_id": KNOWN[2]},
            },
        }
    )
    state = build_state(
        config, [], gateway_key=GATEWAY_KEY, admin_token=admin, online=OnlineSettings()
    )
    app = build_app(state, LIMITS)
    gw = ServerThread(app, "127.0.0.1", 0, shutdown_timeout=0.5).start()
    try:
        with httpx.Client() as http:
            yield Gateway(gw.url, app, upstream, http)
    finally:
        gw.stop()
        up.stop()


@pytest.fixture(scope="module")
def gw() -> Iterator[Gateway]:
    with gateway() as running:
        yield running


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


# --- unlisted model ids ---------------------------------------------------------------------


def test_an_unlisted_model_is_a_404_naming_the_known_ids(gw: Gateway) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        gw.openai().chat.completions.create(**chat("gpt-5-on-your-bill"))
    error = caught.value.response.json()["error"]
    assert (error["code"], error["param"]) == ("model_not_found", "model")
    assert "'gpt-5-on-your-bill'" in error["message"]
    assert all(repr(m) in error["message"] for m in KNOWN), error["message"]
    with pytest.raises(openai.NotFoundError) as responses:
        gw.openai().responses.create(model="gpt-5-on-your-bill", input="hi")
    assert responses.value.response.json()["error"]["code"] == "model_not_found"
    with pytest.raises(anthropic.NotFoundError) as refused:
        gw.anthropic().messages.create(**chat("claude-on-your-bill"))
    body = refused.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
    assert all(repr(m) in body["error"]["message"] for m in KNOWN)
    assert gw.upstream.models == []  # nothing was sent with the operator's key
    # A listed id is forwarded as before, and /v1/models lists exactly the known ids.
    reply = gw.openai().chat.completions.create(**chat("judge-1"))
    assert reply.choices[0].message.content == "forwarded" and gw.upstream.models == ["judge-1"]
    assert sorted(m.id for m in gw.openai().models.list()) == sorted(KNOWN)


def test_allow_unlisted_models_forwards_any_id() -> None:
    with gateway(allow_unlisted=True) as open_gw:
        reply = open_gw.openai().chat.completions.create(**chat("anything-at-all"))
        message = open_gw.anthropic().messages.create(**chat("any-claude"))
    assert reply.choices[0].message.content == "forwarded"
    assert message.content[0].type == "text"
    assert open_gw.upstream.models == ["anything-at-all", "any-claude"]


def test_allow_unlisted_models_is_validated_and_reported(tmp_path: Path) -> None:
    from areal.cli.router_validate import check_router

    path = tmp_path / "router.yaml"
    path.write_text(
        "api_gateway:\n  base_url: http://127.0.0.1:1/v1\n  allow_unlisted_models: yes-please\n"
    )
    assert "allow_unlisted_models" in check_router(path).errors[0]
    path.write_text(
        "api_gateway:\n  base_url: http://127.0.0.1:1/v1\n  allow_unlisted_models: true\n"
    )
    report = check_router(path)
    assert not report.errors and report.to_json()["allow_unlisted_models"] is True
    assert "any other model id: forwarded" in report.summary()[-1]


# --- the admin routes -------------------------------------------------------------------------

# The /rl routes that take the gateway key too (the online conversations' own routes: the
# agent's operator rates them with the key the agent has). Every other /rl route is admin-only.
GATEWAY_KEY_ROUTES = {
    "GET /rl/conversations/{name}",
    "POST /rl/conversations/{name}/end",
    "POST /rl/conversations/{name}/reward",
    "POST /rl/completions/{completion_id}/reward",
}


def rl_routes(app: web.Application) -> list[tuple[str, str]]:
    """Every (method, path) under /rl and /gateway/rl, as the app has them (HEAD aside)."""
    found = set()
    for route in app.router.routes():
        path = route.resource.canonical if route.resource else ""
        if route.method != "HEAD" and is_rl_path(path):
            found.add((route.method, path))
    return sorted(found)


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "nope", path)


def open_session(gw: Gateway) -> dict[str, str]:
    resp = gw.call("POST", "/rl/sessions", ADMIN_TOKEN, json={})
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_every_rl_route_needs_the_admin_token(gw: Gateway) -> None:
    routes = rl_routes(gw.app)
    assert len(routes) >= 2 * 19, routes  # both prefixes; a lost route would shrink this
    session_key = open_session(gw)["api_key"]
    for method, path in routes:
        url = concrete(path)
        name = f"{method} {path.removeprefix('/gateway')}"
        for key in (None, "not-a-key-0123456789", ADMIN_TOKEN[:-1]):
            resp = gw.call(method, url, key, json={})
            assert resp.status_code == 401, (name, key, resp.text)
            assert resp.json()["error"]["code"] == "invalid_api_key", (name, resp.text)
        for who, key in (("gateway", GATEWAY_KEY), ("session", session_key)):
            resp = gw.call(method, url, key, json={})
            if who == "gateway" and name in GATEWAY_KEY_ROUTES:
                assert resp.status_code not in (401, 403), (name, resp.text)
            else:
                assert resp.status_code in (401, 403), (name, who, resp.text)
        resp = gw.call(method, url, ADMIN_TOKEN, json={})
        assert resp.status_code not in (401, 403), (name, resp.text)
    listed = {f"{m} {p}" for m, p in routes if not p.startswith("/gateway")}
    assert listed >= GATEWAY_KEY_ROUTES  # the exceptions above are real routes
    # The API routes take no key-less caller either, in their own schema.
    assert gw.call("GET", "/v1/models", None).json()["error"]["code"] == "invalid_api_key"
    refused = gw.call("POST", "/v1/messages", None, json=chat("judge-1"))
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
    assert gw.call("GET", "/health", None).status_code == 200


def test_without_an_admin_token_no_key_opens_the_admin_routes() -> None:
    with gateway(admin=None) as closed:
        for method, path in rl_routes(closed.app):
            name = f"{method} {path}"
            for key in (GATEWAY_KEY, "admin", "areal", ""):
                resp = closed.call(method, concrete(path), key or None, json={})
                assert resp.status_code in (401, 403, 404), (name, key, resp.text)
                if resp.status_code == 404:
                    assert resp.json()["error"]["code"] in (
                        "session_api_off",
                        "conversation_not_found",
                        "completion_not_found",
                    ), (name, resp.text)


# --- session keys die with their session ------------------------------------------------------


@pytest.mark.parametrize("how", ["end", "discard", "discard_matching"])
def test_a_session_key_dies_with_its_session(gw: Gateway, how: str) -> None:
    opened = gw.call("POST", "/rl/sessions", ADMIN_TOKEN, json={"metadata": {"worker": how}})
    session_id, key = opened.json()["session_id"], opened.json()["api_key"]
    assert gw.call("GET", "/v1/models", key).status_code == 200
    assert gw.call("GET", f"/rl/sessions/{session_id}", key).status_code == 200
    if how == "discard_matching":
        ended = gw.call(
            "POST", "/rl/sessions/discard", ADMIN_TOKEN, json={"metadata": {"worker": how}}
        )
    else:
        ended = gw.call(
            "POST", f"/rl/sessions/{session_id}/end", key, json={"discard": how == "discard"}
        )
    assert ended.status_code == 200, ended.text
    dead = gw.call("GET", "/v1/models", key)
    assert dead.status_code == 401 and dead.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0).messages.create(
            **chat("judge-1")
        )
    assert gw.call("GET", f"/rl/sessions/{session_id}", key).status_code == 401
    assert gw.call("POST", f"/rl/sessions/{session_id}/end", key, json={}).status_code == 401


# --- size and time limits ---------------------------------------------------------------------


def raw_exchange(port: int, data: bytes, wait: float = 5.0) -> bytes:
    """Send ``data`` on a fresh connection; everything the gateway answers until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        sock.sendall(data)
        chunks = []
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while chunk := sock.recv(65536):
                chunks.append(chunk)
    return b"".join(chunks)


def test_headers_past_the_limit_get_431_in_schema(gw: Gateway) -> None:
    big = {"x-padding": "a" * (LIMITS.max_header_bytes + 1)}
    resp = gw.call("POST", "/v1/chat/completions", headers=big, json=chat("judge-1"))
    assert resp.status_code == 431 and resp.json()["error"]["code"] == "headers_too_large"
    anth = gw.call("POST", "/v1/messages", headers=big, json=chat("judge-1"))
    assert anth.status_code == 431 and anth.json()["type"] == "error"
    many = {f"x-h{i}": "b" * 200 for i in range(100)}  # 20 KB in many small headers
    assert gw.call("GET", "/v1/models", headers=many).status_code == 431
    # Past what the parser buffers for one line: a plain 400, the connection closed.
    line = b"x-huge: " + b"c" * (LIMITS.max_line_bytes + 10) + b"\r\n"
    answer = raw_exchange(gw.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + line + b"\r\n")
    assert re.match(rb"HTTP/1\.[01] 400 ", answer), answer[:100]
    assert b"c" * 200 not in answer
    assert gw.call("GET", "/v1/models").status_code == 200  # and the gateway serves on


def test_a_body_past_the_limit_gets_413_in_schema(gw: Gateway) -> None:
    body = chat("judge-1")
    body["messages"][0]["content"] = "x" * (LIMITS.max_body_bytes + 1)
    resp = gw.call("POST", "/v1/chat/completions", json=body)
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "body_too_large"
    anth = gw.call("POST", "/v1/messages", json=body)
    assert anth.status_code == 413 and anth.json()["error"]["type"] == "request_too_large"


def test_a_trickling_body_gets_408(gw: Gateway) -> None:
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {GATEWAY_KEY}\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000\r\n\r\n"
    )
    started = time.monotonic()
    answer = raw_exchange(gw.port, head.encode() + b'{"model": ', wait=LIMITS.body_timeout_s + 12)
    assert re.match(rb"HTTP/1\.[01] 408 ", answer), answer[:200]
    assert b'"body_timeout"' in answer
    assert time.monotonic() - started >= LIMITS.body_timeout_s


def test_idle_and_half_sent_connections_starve_no_one(gw: Gateway) -> None:
    """A slow-loris client: 300 connections that never finish a request."""
    half_head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: appl"
    half_body = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {GATEWAY_KEY}"
        "\r\nContent-Length: 5000\r\n\r\n{"
    ).encode()
    socks = []
    try:
        for i in range(300):
            sock = socket.create_connection(("127.0.0.1", gw.port), timeout=5)
            if i % 3 == 1:
                sock.sendall(half_head)
            elif i % 3 == 2:
                sock.sendall(half_body)
            socks.append(sock)
        for _ in range(5):
            assert gw.call("GET", "/v1/models").status_code == 200
        reply = gw.openai().chat.completions.create(**chat("judge-1"))
        assert reply.choices[0].message.content == "forwarded"
        newest_idle = socks[-3]  # (i % 3 == 0): served while it is still held open
        newest_idle.setblocking(False)
        with pytest.raises(BlockingIOError):
            newest_idle.recv(1)  # nothing said, nothing closed
        # The idle and the half-headed ones are closed after idle_timeout_s, the half-bodied
        # ones answered 408 after body_timeout_s: none is held for long.
        deadline = time.monotonic() + LIMITS.idle_timeout_s + 10
        for sock in socks:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ConnectionResetError):
                while sock.recv(65536):
                    pass  # a 408 for the half-bodied ones, then the end
        assert time.monotonic() < deadline
    finally:
        for sock in socks:
            sock.close()


# --- where it listens -------------------------------------------------------------------------


def test_loopback_is_told_apart() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "", "10.1.2.3", "192.168.0.10", "no-such-host.invalid"):
        assert not is_loopback(host), host
    assert remote_bind_refusal("0.0.0.0", True, "gateway") is None
    line = remote_bind_refusal("0.0.0.0", False, "gateway")
    assert line is not None and "--allow-remote" in line and "\n" not in line


def one_line_error(command: list[str]) -> str:
    env = {k: v for k, v in os.environ.items() if k != "AREAL_DEBUG"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode != 0, result
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    "command",
    [
        [sys.executable, "-m", "areal.gateway.server", "--config", ROUTER, "--host", "0.0.0.0"],
        [sys.executable, "-m", "areal", "serve", "gateway", "--config", ROUTER, "--host", "::"],
        [sys.executable, "-m", "areal", "serve", "inference", "--model", "x", "--host", "0.0.0.0"],
    ],
    ids=["gateway.server", "serve-gateway", "serve-inference"],
)
def test_a_remote_address_needs_allow_remote(command: list[str]) -> None:
    line = one_line_error(command)
    assert line.startswith("error: --host ") and "--allow-remote" in line, line


def test_allow_remote_binds_every_interface(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "areal.gateway.server", "--config", ROUTER]
    command += ["--host", "0.0.0.0", "--allow-remote", "--log-dir", str(tmp_path / "logs")]
    # Healthy on 127.0.0.1 while bound to every interface (it raises otherwise).
    start_on_free_port(
        with_port(command),
        log_path=tmp_path / "gateway.out",
        timeout=60,
        name="gateway",
    ).stop()


# --- TLS --------------------------------------------------------------------------------------


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made with the openssl CLI."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed (needed to make a test certificate)")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


def test_tls_when_a_certificate_is_given(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    port = pick_free_port()
    env = {k: v for k, v in os.environ.items() if k != "AREAL_ADMIN_TOKEN"}
    env["AREAL_GATEWAY_KEY"] = GATEWAY_KEY
    command = [sys.executable, "-m", "areal", "serve", "gateway", "--config", ROUTER]
    command += ["--port", str(port), "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)]
    command += ["--log-dir", str(tmp_path / "logs")]
    url = f"https://127.0.0.1:{port}"
    trust = ssl.create_default_context(cafile=str(cert))
    with ServerProcess(command, log_path=tmp_path / "gateway.out", env=env, name="gateway") as proc:
        health = eventually(
            lambda: not proc.running or httpx.get(url + "/health", verify=trust, timeout=2),
            60,
            "the gateway answering on HTTPS (or exiting)",
        )
        assert proc.running, proc.log_tail()
        assert health.status_code == 200
        with httpx.Client(verify=trust) as http:
            client = openai.OpenAI(
                base_url=url + "/v1", api_key=GATEWAY_KEY, http_client=http, max_retries=0
            )
            assert [m.id for m in client.models.list()] == ["areal-tiny"]
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)  # no plain HTTP
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=2)  # an unknown certificate is refused
        # No default admin token: without AREAL_ADMIN_TOKEN the admin routes are off.
        for guess in ("admin", "areal", GATEWAY_KEY):
            off = httpx.get(
                url + "/rl/engines",
                headers={"Authorization": f"Bearer {guess}"},
                verify=trust,
                timeout=5,
            )
            assert off.status_code == 404 and off.json()["error"]["code"] == "session_api_off"


def test_tls_needs_both_files(tmp_path: Path) -> None:
    cert, _ = self_signed(tmp_path)
    line = one_line_error(
        [
            sys.executable,
            "-m",
            "areal.gateway.server",
            "--config",
            ROUTER,
            "--ssl-certfile",
            str(cert),
        ]
    )
    assert "--ssl-keyfile" in line
    line = one_line_error(
        [sys.executable, "-m", "areal", "serve", "gateway", "--config", ROUTER,
         "--ssl-certfile", str(cert), "--ssl-keyfile", str(tmp_path / "missing.pem")]
    )  # fmt: skip
    assert line.startswith("error: cannot load the TLS certificate"), line
