"""The gateway application: auth, errors in each protocol's schema, the access log, the routes.

Every API route is served under ``/v1``, ``/gateway/v1`` (the seed article's URL) and without a
prefix (some clients drop ``/v1``); aiohttp matches paths without the query, so
``/v1/messages?beta=true`` works as it is.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from areal.gateway.access_log import AccessLog
from areal.gateway.errors import GatewayError, error_response
from areal.gateway.policy import Generation, PolicyService
from areal.gateway.router_config import RouterConfig
from areal.gateway.sessions import Session, SessionManager

log = logging.getLogger("areal.gateway")

API_PREFIXES: tuple[str, ...] = ("/v1", "/gateway/v1", "")
RL_PREFIXES: tuple[str, ...] = ("/rl", "/gateway/rl")
MAX_BODY_BYTES = 32 * 1024**2

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Caller:
    """Who is calling: a plain client (gateway key), an RL episode (session key) or the admin."""

    kind: str  # "gateway" | "session" | "admin" | "anonymous"
    session: Session | None = None


@dataclass
class GatewayState:
    config: RouterConfig
    policy: PolicyService
    sessions: SessionManager
    gateway_key: str = field(repr=False)
    admin_token: str | None = field(default=None, repr=False)
    upstream: Any = None  # areal.gateway.upstream.UpstreamChannel when api_gateway is configured
    access_log: AccessLog = field(default_factory=lambda: AccessLog(None))

    async def record(self, request: web.Request, generation: Generation) -> str | None:
        """Record a finished policy completion into the caller's session, if it has one."""
        caller = request[CALLER]
        if caller.session is None:
            return None
        return await self.sessions.record(
            caller.session, model=self.policy.model_id, generation=generation
        )


STATE = web.AppKey("state", GatewayState)
CALLER = web.RequestKey("caller", Caller)
LOG_FIELDS = web.RequestKey("log", dict)  # what a handler adds to its gateway.log line
BOUND_SESSION = "_bound_session"  # in LOG_FIELDS, not logged: a hint-bound call's session


def state_of(request: web.Request) -> GatewayState:
    return request.app[STATE]


def caller_of(request: web.Request) -> Caller:
    return request[CALLER]


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


def _not_json(name: str) -> Any:
    """Python's json reads NaN and Infinity, which JSON does not have: refuse them."""
    raise GatewayError(400, f"the body is not valid JSON: {name} is not a JSON value")


async def read_json(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object, or a 400 that says what is wrong with it."""
    raw = await request.read()
    if not raw.strip():
        raise GatewayError(400, "the body is empty; send a JSON object")
    try:
        body = json.loads(raw, parse_constant=_not_json)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise GatewayError(400, f"the body is not valid JSON: {err}") from None
    except RecursionError:  # json's parser recurses once per level of nesting
        raise GatewayError(400, "the body's JSON is nested too deeply") from None
    if not isinstance(body, dict):
        raise GatewayError(400, "the body must be a JSON object")
    return body


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def build_app(state: GatewayState) -> web.Application:
    from areal.gateway import anthropic, models, openai_chat, openai_responses, rl_control, trace

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
