"""What every gateway handler reads off a request: the JSON body (strictly), who is calling, and
the fields its ``gateway.log`` line carries. The bottom layer of the gateway: it imports no other
gateway module at run time, so state, sessions and every protocol front end can use it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from areal.gateway.errors import GatewayError

if TYPE_CHECKING:
    from areal.gateway.sessions import Session


@dataclass
class Caller:
    """Who is calling: a plain client (gateway key), an RL episode (session key) or the admin."""

    kind: str  # "gateway" | "session" | "admin" | "anonymous"
    session: Session | None = None


CALLER = web.RequestKey("caller", Caller)
LOG_FIELDS = web.RequestKey("log", dict)  # what a handler adds to its gateway.log line
BOUND_SESSION = "_bound_session"  # in LOG_FIELDS, not logged: a hint-bound call's session


def caller_of(request: web.Request) -> Caller:
    return request[CALLER]


def presented_key(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return request.headers.get("x-api-key") or request.headers.get("api-key") or None


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
