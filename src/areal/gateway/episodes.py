"""Which episode a call belongs to, and what an aborted generation means — shared by every protocol.

A call belongs to the caller's session (session key); else to the session a driver bound to the
client's own hint (``POST /rl/sessions {"hint": ...}``); else, with ``--online``, to the online
conversation its ``x-areal-conversation`` header or hint names (:mod:`areal.gateway.online`), in
the group its ``x-areal-group`` header or ``metadata.areal_group`` names
(:mod:`areal.gateway.online_groups`); else just to the hint, which still groups the calls in
``gateway.log`` and keeps a conversation on one engine's KV cache.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from areal.gateway.callers import caller_of
from areal.gateway.errors import GatewayError
from areal.gateway.gateway_state import GatewayState, state_of
from areal.gateway.online import Conversation, OnlineConversations
from areal.gateway.online_groups import named_group, prompt_digest
from areal.gateway.policy import Generation
from areal.gateway.recording import CONVERSATION, RECORDING, Recording
from areal.gateway.request_log import BOUND_SESSION, LOG_FIELDS
from areal.gateway.sessions import Session

HINT_MAX = 128


def conversation_key(request: web.Request, hint: str | None) -> str | None:
    """An online conversation's key: the ``x-areal-conversation`` header, else the hint."""
    named = request.headers.get(CONVERSATION, "").strip()
    if len(named) > HINT_MAX:
        raise GatewayError(
            400,
            f"the {CONVERSATION} header must be at most {HINT_MAX} characters, got {len(named)}",
        )
    return named or hint


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
    bound: Session | None = (
        None  # a hinted or online session: recorded into although the key is plain
    )
    conversation: Conversation | None = None  # the online conversation, when there is one

    @classmethod
    async def of(
        cls,
        request: web.Request,
        state: GatewayState,
        body: dict[str, Any],
        *,
        bind_hints: bool = True,
        admit: bool = True,
    ) -> Episode:
        """The episode of a policy call, and whether it is recorded (the response headers of
        :mod:`areal.gateway.recording`). ``bind_hints``: a driver's hint-bound session may take
        the call; ``admit``: an online conversation may (``False`` for calls that generate
        nothing, such as counting tokens)."""
        caller = caller_of(request)
        if caller.session is not None:
            request[RECORDING] = Recording(True)
            return cls(caller.session.session_id)
        hint = session_hint(request, body)
        bound = state.sessions.hint(hint) if hint and bind_hints else None
        if bound is None and admit and state.online is not None and caller.kind == "gateway":
            key = conversation_key(request, hint)
            if key is not None:
                return await cls._online(request, state.online, key, body)
        if admit:
            request[RECORDING] = Recording(bound is not None)
        if not hint or not bind_hints:
            return cls()
        if bound is not None:
            bound.touch()  # activity, as a call with its key would be
            request[LOG_FIELDS][BOUND_SESSION] = bound
        name = bound.session_id if bound is not None else hint
        request[LOG_FIELDS]["session"] = re.sub(r"[^A-Za-z0-9._:@-]", "_", name)
        return cls(name, bound)

    @classmethod
    async def _online(
        cls, request: web.Request, online: OnlineConversations, key: str, body: dict[str, Any]
    ) -> Episode:
        """Join or open the conversation of ``key`` in the group the call names (a 429 when the
        budget has no room, a 400 for a bad group name, a 409 for another group than its own)."""
        prompt = prompt_digest(body) if online.groups.wants_prompt else None
        conversation, opened = await online.admit(
            key, group=named_group(request, body), prompt=prompt
        )
        request[RECORDING] = Recording(True, conversation, opened)
        session = conversation.session
        request[LOG_FIELDS][BOUND_SESSION] = session
        request[LOG_FIELDS]["session"] = session.session_id
        return cls(session.session_id, session, conversation)

    def answered(self, request: web.Request, response_id: str) -> None:
        """The id the client gets for this call: the handle that rewards its conversation."""
        online = state_of(request).online
        if self.conversation is not None and online is not None:
            online.answered(response_id, self.conversation)

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
