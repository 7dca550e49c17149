"""The middleware every request passes: hold it to the size and time limits, authenticate the
caller, answer every failure in the protocol's error schema, write one ``gateway.log`` line.

:class:`HttpLimits` are what one connection may cost the gateway: a request's headers (``431``
beyond), its body (``413``), how long its head and its body may take to arrive (an idle or
half-sent connection is closed; a body that trickles gets ``408``). The server is asyncio, so
idle connections hold no worker; the limits keep them from holding memory and file descriptors
for long (a slow-loris client does not starve the others).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from areal.gateway.callers import CALLER, Caller
from areal.gateway.engine_pool import CALL_GROUP, LOST_CALLS
from areal.gateway.errors import GatewayError, error_response
from areal.gateway.gateway_state import GatewayState, state_of
from areal.gateway.recording import RECORDING
from areal.gateway.request_log import BOUND_SESSION, LOG_FIELDS

log = logging.getLogger("areal.gateway")

RL_PREFIXES: tuple[str, ...] = ("/rl", "/gateway/rl")  # their routes check their own keys
MAX_BODY_BYTES = 32 * 1024**2
# The request's own fields a gateway.log line adds when it has them, in this order.
LOGGED_FIELDS = ("upstream", "error", "dropped_tools", "tools_fallback")


@dataclass(frozen=True)
class HttpLimits:
    """Size and time limits per request and connection (see the module docstring)."""

    max_body_bytes: int = MAX_BODY_BYTES
    max_header_bytes: int = 16 * 1024  # all header lines of one request together: 431 beyond
    # What the HTTP parser buffers for one line (request line or header) and how many headers it
    # takes; beyond either it answers a plain 400 and closes: these only bound the buffering.
    max_line_bytes: int = 64 * 1024
    max_headers: int = 128
    idle_timeout_s: float = 30.0  # no whole request head for this long: the connection closes
    body_timeout_s: float = 60.0  # the body must have arrived by then: 408
    # After an answer that left some of the body unread (a 408, a 413), what is still sent is
    # read and dropped for this long, so the client sees the answer; then the connection closes.
    linger_s: float = 2.0

    def handler_args(self) -> dict[str, Any]:
        """The HTTP server's own settings for these limits (aiohttp's request handler)."""
        return {
            "max_line_size": self.max_line_bytes,
            "max_field_size": self.max_line_bytes,
            "max_headers": self.max_headers,
            # From a connection's start and between keep-alive requests: a connection that has
            # not sent a whole request head in this time is closed.
            "keepalive_timeout": self.idle_timeout_s,
            "lingering_time": self.linger_s,
        }


LIMITS = web.AppKey("limits", HttpLimits)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def presented_key(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return request.headers.get("x-api-key") or request.headers.get("api-key") or None


def _same(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and hmac.compare_digest(a.encode(), b.encode())


def identify(state: GatewayState, request: web.Request) -> Caller:
    key = presented_key(request)
    if key is None:
        return Caller("anonymous")
    if _same(key, state.admin_token):
        return Caller("admin")
    if _same(key, state.gateway_key):
        return Caller("gateway")
    session = state.sessions.lookup(key)
    if session is not None:
        return Caller("session", session)
    return Caller("anonymous")


def is_rl_path(path: str) -> bool:
    return any(path.startswith(p + "/") or path == p for p in RL_PREFIXES)


@web.middleware
async def gateway_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Authenticate, turn every failure into the protocol's error schema, log one line."""
    state = state_of(request)
    started = time.perf_counter()
    request[LOG_FIELDS] = {}
    caller = identify(state, request)
    request[CALLER] = caller
    status = 500
    if caller.session is not None:  # a call with a session key keeps its session alive
        caller.session.busy += 1
    lost_calls: list[str] = []
    box = LOST_CALLS.set(lost_calls)
    calls = caller.session.engine_calls if caller.session is not None else None
    group = CALL_GROUP.set(None if is_rl_path(request.path) else calls)
    try:
        limits = request.app.get(LIMITS) or HttpLimits()
        _check_headers(request, limits)
        if (
            request.path != "/health"
            and not is_rl_path(request.path)
            and caller.kind not in ("gateway", "session", "admin")
        ):
            raise GatewayError(
                401,
                "missing or wrong API key: send the gateway key (AREAL_GATEWAY_KEY) or a session key "
                "as 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                code="invalid_api_key",
            )
        await _read_body(request, limits)
        if caller.session is not None and not is_rl_path(request.path):
            await state.sessions.refuse_if_stale(caller.session)  # a 410 once it cannot train
        response = await handler(request)
        status = response.status
        return response
    except GatewayError as err:
        status = err.status
        if err.code:
            request[LOG_FIELDS].setdefault("error", err.code)
        return error_response(request.path, err)
    except web.HTTPRequestEntityTooLarge:
        status = 413
        request[LOG_FIELDS]["error"] = "body_too_large"
        limit = (request.app.get(LIMITS) or HttpLimits()).max_body_bytes
        return error_response(
            request.path,
            GatewayError(
                413, f"the body is larger than {limit} bytes, the limit", code="body_too_large"
            ),
        )
    except web.HTTPException as err:
        if err.status < 400:
            raise
        status = err.status
        return error_response(
            request.path, GatewayError(err.status, f"{request.method} {request.path}: {err.reason}")
        )
    except Exception as err:  # a bug of ours: still the protocol's schema, and logged
        log.exception("unhandled error on %s", request.path)
        return error_response(
            request.path, GatewayError(500, f"internal error: {type(err).__name__}")
        )
    finally:
        LOST_CALLS.reset(box)
        CALL_GROUP.reset(group)
        recording = request.get(RECORDING)
        if recording is not None and recording.conversation is not None and state.online:
            await state.online.call_done(
                recording.conversation, opened=recording.opened, failed=status >= 400
            )
        if caller.session is not None:
            caller.session.busy -= 1
            caller.session.touch()
        info = request[LOG_FIELDS]
        traced = caller.session or info.pop(BOUND_SESSION, None)
        if traced is not None and lost_calls:
            traced.lost_calls += len(lost_calls)  # a hole in the episode: it ends discarded
        if traced is not None and not is_rl_path(request.path):
            traced.note_call(path=request.path, model=info.get("model"), status=status)
        # ``upstream``: what each attempt at the upstream channel came to (``429,200``);
        # ``error``: the error's code; ``dropped_tools``: hosted tools left out of the prompt;
        # ``tools_fallback``: tools said in the system turn (a template without tools). Each
        # only on the lines that have it.
        extra = {k: info[k] for k in LOGGED_FIELDS if info.get(k) is not None}
        state.access_log.write(
            session=caller.session.session_id if caller.session else info.get("session"),
            model=info.get("model"),
            route=info.get("route"),
            status=status,
            latency_ms=(time.perf_counter() - started) * 1000,
            retries=info.get("retries", 0),
            **extra,
            path=request.path,
        )


def _check_headers(request: web.Request, limits: HttpLimits) -> None:
    size = sum(len(name) + len(value) + 4 for name, value in request.raw_headers)
    if size > limits.max_header_bytes:
        raise GatewayError(
            431,
            f"the request's headers are {size} bytes, more than the limit of "
            f"{limits.max_header_bytes}",
            code="headers_too_large",
        )


async def _read_body(request: web.Request, limits: HttpLimits) -> None:
    """Read the whole body now (the handlers' ``read()`` then has it), within the time limit."""
    if not request.body_exists:
        return
    try:
        async with asyncio.timeout(limits.body_timeout_s):  # no task, unlike wait_for
            await request.read()
    except TimeoutError:
        raise GatewayError(
            408,
            f"the request body did not arrive within {limits.body_timeout_s:g}s",
            code="body_timeout",
        ) from None
