"""The middleware every request passes: authenticate the caller, answer every failure in the
protocol's error schema, write one ``gateway.log`` line."""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from areal.gateway.callers import CALLER, Caller
from areal.gateway.engine_pool import LOST_CALLS
from areal.gateway.errors import GatewayError, error_response
from areal.gateway.gateway_state import GatewayState, state_of
from areal.gateway.recording import RECORDING
from areal.gateway.request_log import BOUND_SESSION, LOG_FIELDS

log = logging.getLogger("areal.gateway")

RL_PREFIXES: tuple[str, ...] = ("/rl", "/gateway/rl")  # their routes check their own keys
MAX_BODY_BYTES = 32 * 1024**2

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
    try:
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
        if caller.session is not None and not is_rl_path(request.path):
            await state.sessions.refuse_if_stale(caller.session)  # a 410 once it cannot train
        response = await handler(request)
        status = response.status
        return response
    except GatewayError as err:
        status = err.status
        return error_response(request.path, err)
    except web.HTTPRequestEntityTooLarge as err:
        status = 413
        return error_response(
            request.path,
            GatewayError(413, f"the body is larger than {MAX_BODY_BYTES} bytes: {err.text}"),
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
        state.access_log.write(
            session=caller.session.session_id if caller.session else info.get("session"),
            model=info.get("model"),
            route=info.get("route"),
            status=status,
            latency_ms=(time.perf_counter() - started) * 1000,
            retries=info.get("retries", 0),
            path=request.path,
        )
