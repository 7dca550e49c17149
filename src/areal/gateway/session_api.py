"""The RL session API over HTTP: ``/rl/sessions`` and each session's status, reward and end.

The routes (documented in :mod:`areal.gateway.sessions`) take the admin token, or for a
session's own routes that session's key; :func:`require_admin` and :func:`session_for` are the
same checks for the other ``/rl`` routes (:mod:`areal.gateway.rl_control`, :mod:`areal.gateway.trace`).
The session state itself lives in :class:`~areal.gateway.sessions.SessionManager`, which knows
nothing of requests.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from areal.gateway.callers import Caller, caller_of
from areal.gateway.errors import GatewayError
from areal.gateway.gateway_state import state_of
from areal.gateway.request_body import optional_json, read_json
from areal.gateway.request_log import LOG_FIELDS
from areal.gateway.sessions import Session, SessionManager

KEY_MIN_CHARS = 16
WAIT_MAX_S = 60.0


def add_routes(app: web.Application, prefixes: tuple[str, ...], sessions: SessionManager) -> None:
    """``/rl/sessions`` and friends (admin token, or a session's own key for its session)."""

    async def create(request: web.Request) -> web.Response:
        require_admin(sessions, request)
        body = await optional_json(request)
        metadata = body.get("metadata", {})
        if metadata is None:
            metadata = {}
        if not isinstance(metadata, dict):
            raise GatewayError(400, "metadata must be a JSON object", param="metadata")
        hint = body.get("hint")
        if hint is not None and (not isinstance(hint, str) or not hint):
            raise GatewayError(400, "hint must be a non-empty string", param="hint")
        task_id = body.get("task_id")
        if task_id is not None and not isinstance(task_id, (str, int)):
            raise GatewayError(400, "task_id must be a string or an integer", param="task_id")
        api_key = _fixed_key(body.get("api_key"), request)
        wait_s = _wait_seconds(body.get("wait_s"))
        session = await sessions.open_waiting(
            wait_s,
            gone=lambda: request.transport is None or request.transport.is_closing(),
            metadata=metadata,
            task_id=task_id,
            hint=hint,
            api_key=api_key,
        )
        request[LOG_FIELDS]["session"] = session.session_id
        return web.json_response({"session_id": session.session_id, "api_key": session.api_key})

    async def list_open(request: web.Request) -> web.Response:
        require_admin(sessions, request)
        open_sessions = sessions.open_sessions()
        return web.json_response(
            {
                "open": sorted(s.session_id for s in open_sessions),
                # for the live monitor: in-flight episodes per rollout worker
                "open_by_worker": _count_by_worker(open_sessions),
                "budget": sessions.budget.snapshot().to_json(),
                # long polls (``wait_s``) held for a slot now: workers the budget holds back
                "waiting": sessions.waiting,
                "discount": sessions.discount,
                "idle_timeout": sessions.idle_timeout,
                "expired": sessions.expired,
                "discarded": sessions.discarded,
                # trajectories the sink holds until the trainer's queue acknowledges them
                # (back-pressure: a full queue makes ``end`` wait with its trajectory here)
                "delivering": sessions.delivering,
                # calls whose client temperature/top_p/top_k/min_p the run's sampling replaced
                "sampling_overridden": dict(state_of(request).policy.overridden),
                # grammar-constrained calls per backend whose log-probs are the masked ones
                "masked_logprobs": dict(state_of(request).policy.masked_logprobs),
                # hosted tools (web search, namespaces...) left out of prompts, by type
                "dropped_tools": dict(state_of(request).policy.dropped_tools),
                # requests whose tools the chat template cannot render, said in the system turn
                "tools_fallback": dict(state_of(request).policy.tools_fallback),
            }
        )

    async def status(request: web.Request) -> web.Response:
        return web.json_response(session_for(sessions, request).status())

    async def reward(request: web.Request) -> web.Response:
        session = session_for(sessions, request)
        body = await read_json(request)
        value = reward_value(body.get("reward"), required=True)
        assert value is not None
        completion_id = body.get("completion_id")
        if completion_id is not None and not isinstance(completion_id, str):
            raise GatewayError(400, "completion_id must be a string", param="completion_id")
        sessions.set_reward(session, value, completion_id)
        return web.json_response(
            {"session_id": session.session_id, "completion_id": completion_id, "reward": value}
        )

    async def end(request: web.Request) -> web.Response:
        session = session_for(sessions, request)
        body = await optional_json(request)
        value = reward_value(body.get("reward"), required=False)
        discard = body.get("discard", False)
        if not isinstance(discard, bool):
            raise GatewayError(400, "discard must be true or false", param="discard")
        if value is not None:
            sessions.set_reward(session, value)
        return web.json_response(await sessions.end(session, discard=discard))

    for prefix in prefixes:
        app.router.add_post(f"{prefix}/sessions", create)
        app.router.add_get(f"{prefix}/sessions", list_open)
        app.router.add_get(f"{prefix}/sessions/{{session_id}}", status)
        app.router.add_post(f"{prefix}/sessions/{{session_id}}/reward", reward)
        app.router.add_post(f"{prefix}/sessions/{{session_id}}/end", end)


# --- who may call -------------------------------------------------------------------------------


def _enabled(sessions: SessionManager) -> None:
    if sessions.admin_token is None:
        raise GatewayError(
            404,
            "the session API is off: set AREAL_ADMIN_TOKEN in the gateway's environment and "
            "restart it to enable /rl/sessions",
            code="session_api_off",
        )


def _authenticated(sessions: SessionManager, request: web.Request) -> Caller:
    _enabled(sessions)
    caller = caller_of(request)
    if caller.kind == "anonymous":
        raise GatewayError(
            401,
            "missing or wrong key: send the admin token (AREAL_ADMIN_TOKEN), or for a "
            "session's own routes its session key, as 'Authorization: Bearer <key>'",
            code="invalid_api_key",
        )
    return caller


def require_admin(sessions: SessionManager, request: web.Request) -> None:
    """A 404 while the session API is off, 401/403 unless the caller has the admin token."""
    if _authenticated(sessions, request).kind != "admin":
        raise GatewayError(
            403,
            "this route needs the admin token (AREAL_ADMIN_TOKEN); gateway and session keys "
            "are refused",
            code="admin_required",
        )


def session_for(sessions: SessionManager, request: web.Request) -> Session:
    """The session in the path, if the caller is the admin or that session itself."""
    caller = _authenticated(sessions, request)
    session_id = request.match_info["session_id"]
    request[LOG_FIELDS]["session"] = session_id
    if caller.kind == "session" and caller.session is not None:
        if caller.session.session_id != session_id:
            raise GatewayError(
                403, "a session key can only act on its own session", code="wrong_session"
            )
        return caller.session
    if caller.kind != "admin":
        raise GatewayError(
            403,
            "this route needs the admin token (AREAL_ADMIN_TOKEN) or the session's own key",
            code="admin_required",
        )
    session = sessions.get(session_id)
    if session is None:
        raise GatewayError(
            404, f"no session {session_id!r} on this gateway", code="session_not_found"
        )
    return session


# --- the fields ---------------------------------------------------------------------------------


def _wait_seconds(value: Any) -> float:
    if value is None:
        return 0.0
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0 <= value <= WAIT_MAX_S
    ):
        raise GatewayError(
            400, f"wait_s must be a number of seconds in [0, {WAIT_MAX_S:g}]", param="wait_s"
        )
    return float(value)


def _fixed_key(value: Any, request: web.Request) -> str | None:
    """A driver-chosen session key: long enough, no whitespace, not the gateway's own keys."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value) < KEY_MIN_CHARS or any(c.isspace() for c in value):
        raise GatewayError(
            400,
            f"api_key must be a string of at least {KEY_MIN_CHARS} characters without whitespace",
            param="api_key",
        )
    state = state_of(request)
    if value in (state.gateway_key, state.admin_token):
        raise GatewayError(
            400,
            "api_key must differ from the gateway key and the admin token (calls made with "
            "those are never recorded into a session)",
            param="api_key",
        )
    return value


def reward_value(value: Any, *, required: bool) -> float | None:
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise GatewayError(
            400, f"reward must be a finite number, got {shown}", param="reward", code="bad_reward"
        )
    return float(value)


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float (JSON's integers have no bound)
        return False


def _count_by_worker(sessions: Iterable[Session]) -> dict[str, int]:
    """Open sessions per ``metadata["worker"]`` (sessions without one are not counted)."""
    counts: dict[str, int] = {}
    for session in sessions:
        worker = session.metadata.get("worker")
        if worker is not None:
            counts[str(worker)] = counts.get(str(worker), 0) + 1
    return counts
