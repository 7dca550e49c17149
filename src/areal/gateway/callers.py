"""Who is calling: the middleware identifies each request's caller once, handlers read it here."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from areal.gateway.sessions import Session


@dataclass
class Caller:
    """A plain client (gateway key), an RL episode (session key) or the admin."""

    kind: str  # "gateway" | "session" | "admin" | "anonymous"
    session: Session | None = None


CALLER = web.RequestKey("caller", Caller)


def caller_of(request: web.Request) -> Caller:
    return request[CALLER]
