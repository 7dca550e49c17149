"""Reading a request's JSON body, so every route refuses bad JSON with the same clear 400."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from areal.gateway.errors import GatewayError


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


async def optional_json(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object; an empty body is ``{}`` (for routes whose fields are optional)."""
    if not (await request.read()).strip():
        return {}
    return await read_json(request)
