"""What a handler adds to its request's ``gateway.log`` line (the middleware writes the line)."""

from __future__ import annotations

from aiohttp import web

LOG_FIELDS = web.RequestKey("log", dict)  # model, route, session, retries, ... of this request
BOUND_SESSION = "_bound_session"  # in LOG_FIELDS, not logged: a hint-bound call's session
