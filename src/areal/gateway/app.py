"""The gateway application: the middleware, every route under its prefixes, start-up and clean-up.

Every API route is served under ``/v1``, ``/gateway/v1`` (the seed article's URL) and without a
prefix (some clients drop ``/v1``); aiohttp matches paths without the query, so
``/v1/messages?beta=true`` works as it is. Only :mod:`areal.gateway.server` (and tests) import this
module: the routes import the request helpers they need from the small modules below it.
"""

from __future__ import annotations

from aiohttp import web

from areal.gateway import (
    anthropic,
    engines_api,
    models,
    online_api,
    openai_chat,
    openai_responses,
    rl_control,
    session_api,
    trace,
    trainer_api,
)
from areal.gateway.gateway_state import STATE, GatewayState
from areal.gateway.middleware import LIMITS, RL_PREFIXES, HttpLimits, gateway_middleware
from areal.gateway.recording import add_headers

API_PREFIXES: tuple[str, ...] = ("/v1", "/gateway/v1", "")


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def build_app(state: GatewayState, limits: HttpLimits | None = None) -> web.Application:
    """The gateway's app; ``limits``: its size and time limits (:class:`HttpLimits`)."""
    limits = limits or HttpLimits()
    app = web.Application(
        middlewares=[gateway_middleware],
        client_max_size=limits.max_body_bytes,
        handler_args=limits.handler_args(),
    )
    app[STATE] = state
    app[LIMITS] = limits
    app.router.add_get("/health", health)
    for module in (openai_chat, openai_responses, anthropic, models):
        module.add_routes(app, API_PREFIXES)
    session_api.add_routes(app, RL_PREFIXES, state.sessions)
    rl_control.add_routes(app, RL_PREFIXES, state.sessions)
    trace.add_routes(app, RL_PREFIXES)
    engines_api.add_routes(app, RL_PREFIXES)
    trainer_api.add_routes(app, RL_PREFIXES)
    online_api.add_routes(app, RL_PREFIXES)
    app.on_response_prepare.append(add_headers)
    reaper = rl_control.IdleReaper(state.sessions)

    async def on_startup(app: web.Application) -> None:
        await state.policy.start()
        reaper.start()
        if state.online is not None:
            state.online.start()

    async def on_shutdown(app: web.Application) -> None:  # before the wait for open requests
        state.sessions.stop_admitting()

    async def on_cleanup(app: web.Application) -> None:
        await reaper.stop()
        if state.online is not None:
            await state.online.stop()
        await state.sessions.close()
        await state.policy.close()
        if state.upstream is not None:
            await state.upstream.close()
        state.access_log.close()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    return app
