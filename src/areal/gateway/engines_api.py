"""``/rl/engines``: attach, list and detach the policy's inference engines while the gateway runs.

Routes, under ``/rl`` and ``/gateway/rl``, all with the admin token:

- ``POST /rl/engines`` ``{"url": ..., "backend": optional, "owner": optional}``: the engine must
  answer ``/model_info``; one behind the trainer's newest published weights loads them first
  (:meth:`PolicyService.attach`); one that still does not serve the run's version after that (a
  collective sync publishes nothing to load, an engine started as ``"default"`` carries no
  version) is held, taking no traffic, until the trainer's next publish reaches it
  (:mod:`.engine_pool`). Attaching a URL again replaces the earlier entry. ``201`` with the
  engine's entry.
- ``GET /rl/engines``: ``{"policy": model_id, "engines": [...]}``, each with ``url``, ``backend``,
  ``owner``, ``healthy``, ``draining``, ``running`` calls, ``served`` calls, ``weight_version``,
  ``held`` (it does not serve the run's version yet: no traffic while another engine can take it).
- ``DELETE /rl/engines`` ``{"url": ..., "drain": optional bool, "timeout": optional seconds}``
  (or the same as query parameters): no new calls; with ``drain`` the running ones may finish
  first; the rest end as lost (:mod:`.engine_pool`). Answers how many finished and how many were
  aborted.
"""

from __future__ import annotations

import math
from typing import Any

from aiohttp import web

from areal.gateway.errors import GatewayError
from areal.gateway.gateway_state import state_of
from areal.gateway.request_body import optional_json, read_json
from areal.gateway.session_api import require_admin

DRAIN_MAX_S = 600.0


def add_routes(app: web.Application, prefixes: tuple[str, ...]) -> None:
    async def attach(request: web.Request) -> web.Response:
        state = state_of(request)
        require_admin(state.sessions, request)
        body = await read_json(request)
        url = _url(body.get("url"))
        backend = _optional_name(body, "backend")
        owner = _optional_name(body, "owner")
        if backend is not None:
            from areal.core.plugins import registry
            from areal.core.registry import RegistryError

            try:
                registry("inference_backends").get(backend, key="backend")
            except RegistryError as err:
                raise GatewayError(400, str(err), param="backend") from None
        engine = await state.policy.attach(url, backend=backend, owner=owner)
        return web.json_response(engine.describe(), status=201)

    async def listing(request: web.Request) -> web.Response:
        state = state_of(request)
        require_admin(state.sessions, request)
        return web.json_response(
            {"policy": state.policy.model_id, "engines": state.policy.pool.describe()}
        )

    async def detach(request: web.Request) -> web.Response:
        state = state_of(request)
        require_admin(state.sessions, request)
        body: dict[str, Any] = dict(request.query)
        body.update(await optional_json(request))
        drain = body.get("drain", False)
        if isinstance(drain, str):
            drain = drain.lower() in ("1", "true", "yes")
        if not isinstance(drain, bool):
            raise GatewayError(400, f"drain must be true or false, got {drain!r}", param="drain")
        timeout = _timeout(body.get("timeout", 30.0))
        answer = await state.policy.pool.detach(_url(body.get("url")), drain=drain, timeout=timeout)
        return web.json_response(answer)

    for prefix in prefixes:
        app.router.add_post(f"{prefix}/engines", attach)
        app.router.add_get(f"{prefix}/engines", listing)
        app.router.add_delete(f"{prefix}/engines", detach)


def _url(value: Any) -> str:
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise GatewayError(
            400,
            f'url must be the engine\'s http(s) base URL, e.g. "http://127.0.0.1:30000"; got {value!r}',
            param="url",
        )
    return value


def _optional_name(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise GatewayError(400, f"{key} must be a non-empty string", param=key)
    return value


def _timeout(value: Any) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    except OverflowError:  # an integer too large for a float
        seconds = math.inf
    if not 0 <= seconds <= DRAIN_MAX_S:
        raise GatewayError(
            400,
            f"timeout must be seconds within [0, {DRAIN_MAX_S:g}], got {_shown(value)}",
            param="timeout",
        )
    return seconds


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
