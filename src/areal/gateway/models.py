"""``GET /v1/models``: the policy and every routed model id."""

from __future__ import annotations

import time

from aiohttp import web

from areal.gateway.gateway_state import state_of


async def list_models(request: web.Request) -> web.Response:
    state = state_of(request)
    ids = [state.policy.model_id] + [
        m for m in state.config.model_routing.routes() if m != state.policy.model_id
    ]
    created = int(time.time())
    data = [{"id": m, "object": "model", "created": created, "owned_by": "areal"} for m in ids]
    return web.json_response({"object": "list", "data": data})


def add_routes(app: web.Application, prefixes: tuple[str, ...]) -> None:
    for prefix in prefixes:
        app.router.add_get(f"{prefix}/models", list_models)
