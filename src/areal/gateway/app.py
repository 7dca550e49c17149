"""The gateway application: auth, errors in each protocol's schema, the access log, the routes.

The top of the gateway: it assembles the front ends on top of :mod:`.state` and :mod:`.request`;
nothing but the server entry point imports it.

Every API route is served under ``/v1``, ``/gateway/v1`` (the seed article's URL) and without a
prefix (some clients drop ``/v1``); aiohttp matches paths without the query, so
``/v1/messages?beta=true`` works as it is.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from areal.gateway import anthropic, models, openai_chat, openai_responses, rl_control, trace
from areal.gateway.errors import GatewayError, error_response
from areal.gateway.request import BOUND_SESSION, CALLER, LOG_FIELDS, Caller, presented_key
from areal.gateway.state import STATE, GatewayState, state_of

log = logging.getLogger("areal.gateway")

API_PREFIXES: tuple[str, ...] = ("/v1", "/gateway/v1", "")
RL_PREFIXES: tuple[str, ...] = ("/rl", "/gateway/rl")
MAX_BODY_BYTES = 32 * 1024**2

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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
        if caller.session is not None:
            caller.session.busy -= 1
            caller.session.touch()
        info = request[LOG_FIELDS]
        traced = caller.session or info.pop(BOUND_SESSION, None)
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


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def build_app(state: GatewayState) -> web.Application:
    app = web.Application(middlewares=[gateway_middleware], client_max_size=MAX_BODY_BYTES)
    app[STATE] = state
    app.router.add_get("/health", health)
    for module in (openai_chat, openai_responses, anthropic, models):
        module.add_routes(app, API_PREFIXES)
    state.sessions.add_routes(app, RL_PREFIXES)
    rl_control.add_routes(app, RL_PREFIXES, state.sessions)
    trace.add_routes(app, RL_PREFIXES)
    reaper = rl_control.IdleReaper(state.sessions)

    async def on_startup(app: web.Application) -> None:
        await state.policy.start()
        reaper.start()

    async def on_cleanup(app: web.Application) -> None:
        await reaper.stop()
        await state.sessions.close()
        await state.policy.close()
        if state.upstream is not None:
            await state.upstream.close()
        state.access_log.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
