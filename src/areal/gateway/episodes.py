"""Which episode a call belongs to, and what an aborted generation means — shared by every protocol.

A call belongs to the caller's session (session key); else to the session a driver bound to the
client's own hint (``POST /rl/sessions {"hint": ...}``); else just to the hint, which still groups
the calls in ``gateway.log`` and keeps a conversation on one engine's KV cache.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from areal.gateway.callers import caller_of
from areal.gateway.errors import GatewayError
from areal.gateway.gateway_state import GatewayState
from areal.gateway.policy import Generation
from areal.gateway.request_log import BOUND_SESSION, LOG_FIELDS
from areal.gateway.sessions import Session

HINT_MAX = 128


def session_hint(request: web.Request, body: dict[str, Any]) -> str | None:
    """A client's own grouping of calls: Claude Code's ``x-claude-code-session-id`` header, else
    ``prompt_cache_key`` (one per conversation in Codex and others), else ``metadata.user_id``
    (Claude Code writes a JSON object there whose ``session_id`` is the same session)."""
    hint = request.headers.get("x-claude-code-session-id") or body.get("prompt_cache_key")
    metadata = body.get("metadata")
    if not (isinstance(hint, str) and hint) and isinstance(metadata, dict):
        user = metadata.get("user_id")
        hint = user if isinstance(user, str) else None
        if hint:
            try:
                decoded = json.loads(hint)
            except json.JSONDecodeError:
                decoded = None
            if isinstance(decoded, dict) and isinstance(decoded.get("session_id"), str):
                hint = decoded["session_id"]
    return hint[:HINT_MAX] if isinstance(hint, str) and hint else None


@dataclass
class Episode:
    sticky: str | None = None
    bound: Session | None = None  # a hinted session: recorded into although the key is plain

    @classmethod
    def of(cls, request: web.Request, state: GatewayState, body: dict[str, Any]) -> Episode:
        caller = caller_of(request)
        if caller.session is not None:
            return cls(caller.session.session_id)
        hint = session_hint(request, body)
        if not hint:
            return cls()
        bound = state.sessions.hint(hint)
        if bound is not None:
            bound.touch()  # activity, as a call with its key would be
            request[LOG_FIELDS][BOUND_SESSION] = bound
        name = bound.session_id if bound is not None else hint
        request[LOG_FIELDS]["session"] = re.sub(r"[^A-Za-z0-9._:@-]", "_", name)
        return cls(name, bound)

    def history(self, request: web.Request) -> list[int] | None:
        """The tokens of this episode so far: its latest completion's prompt and output (what
        :meth:`PolicyService.render` may reuse); None outside a session or before its first call."""
        session = caller_of(request).session or self.bound
        if session is None or not session.completions:
            return None
        last = max(session.completions, key=lambda c: c.turn)
        return list(last.prompt_ids) + list(last.output_ids)

    async def record(
        self, request: web.Request, state: GatewayState, gen: Generation
    ) -> str | None:
        """Record a policy generation (an aborted or unfinished one is counted, not kept)."""
        if self.bound is not None:
            return await state.sessions.record(
                self.bound, model=state.policy.model_id, generation=gen
            )
        return await state.record(request, gen)


def check_not_aborted(gen: Generation | None) -> Generation:
    """An aborted generation (engine shutdown, an abort request) is no answer: the client retries."""
    if gen is not None and gen.finished and gen.finish_reason != "abort":
        return gen
    reason = gen.meta.get("finish_reason") if gen is not None else None
    detail = reason.get("message") if isinstance(reason, dict) else None
    status = reason.get("status_code") if isinstance(reason, dict) else None
    code = 502 if isinstance(status, int) and status >= 500 else 503
    where = f" at {gen.engine}" if gen is not None and gen.engine else ""
    raise GatewayError(
        code, f"the inference engine{where} aborted the generation ({detail or 'abort'}); retry"
    )
