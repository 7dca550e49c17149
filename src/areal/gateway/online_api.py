"""The online conversations over HTTP (``--online``; state in :mod:`areal.gateway.online`).

Routes, under ``/rl`` and ``/gateway/rl``; the gateway key suffices (the agent's operator rates
its conversations with the key the agent already has), the admin token works too:

- ``POST /rl/conversations/{id}/end`` ``{"reward": optional float, "discard": optional bool}``:
  the conversation takes no more calls; with a reward it is trained on at once, without one it
  waits ``--online-reward-wait`` seconds for ``.../reward``.
- ``POST /rl/conversations/{id}/reward`` ``{"reward": float}``: the reward of an open or ended
  conversation (an open one keeps it until it ends).
- ``POST /rl/completions/{completion_id}/reward`` ``{"reward": float}``: the same, for the
  conversation a response id the gateway returned belongs to (chat completion, response or
  message ``id``).
- ``GET /rl/conversations/{id}``: one conversation; ``GET /rl/conversations`` (admin): the open
  and awaiting ones, the timeouts, the counts and the budget.

``{id}`` is a conversation's key (its newest conversation) or its session id, both sent back on
every recorded response (``x-areal-conversation``, ``x-areal-session``).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from areal.gateway.callers import caller_of
from areal.gateway.errors import GatewayError
from areal.gateway.gateway_state import state_of
from areal.gateway.online import Conversation, OnlineConversations
from areal.gateway.request_body import optional_json, read_json
from areal.gateway.request_log import LOG_FIELDS
from areal.gateway.session_api import require_admin, reward_value


def add_routes(app: web.Application, prefixes: tuple[str, ...]) -> None:
    async def listing(request: web.Request) -> web.Response:
        online = _online(request)
        require_admin(state_of(request).sessions, request)
        return web.json_response(online.listing())

    async def status(request: web.Request) -> web.Response:
        online, conversation = _conversation(request)
        return web.json_response(online.status(conversation))

    async def end(request: web.Request) -> web.Response:
        online, conversation = _conversation(request)
        body = await optional_json(request)
        value = reward_value(body.get("reward"), required=False)
        discard = body.get("discard", False)
        if not isinstance(discard, bool):
            raise GatewayError(400, "discard must be true or false", param="discard")
        return web.json_response(await online.end(conversation, value, discard=discard))

    async def reward(request: web.Request) -> web.Response:
        online, conversation = _conversation(request)
        return web.json_response(await online.reward(conversation, await _reward(request)))

    async def reward_completion(request: web.Request) -> web.Response:
        online = _online(request)
        _check_key(request)
        completion_id = request.match_info["completion_id"]
        conversation = online.by_answer(completion_id)
        if conversation is None:
            raise GatewayError(
                404,
                f"no online conversation answered with id {completion_id!r} on this gateway",
                code="completion_not_found",
            )
        request[LOG_FIELDS]["session"] = conversation.session.session_id
        return web.json_response(await online.reward(conversation, await _reward(request)))

    for prefix in prefixes:
        app.router.add_get(f"{prefix}/conversations", listing)
        app.router.add_get(f"{prefix}/conversations/{{name}}", status)
        app.router.add_post(f"{prefix}/conversations/{{name}}/end", end)
        app.router.add_post(f"{prefix}/conversations/{{name}}/reward", reward)
        app.router.add_post(f"{prefix}/completions/{{completion_id}}/reward", reward_completion)


def _online(request: web.Request) -> OnlineConversations:
    online = state_of(request).online
    if online is None:
        raise GatewayError(
            404,
            "online conversations are off: start the gateway with --online to record the calls "
            "agents make with the plain gateway key",
            code="online_off",
        )
    return online


def _check_key(request: web.Request) -> None:
    if caller_of(request).kind not in ("gateway", "admin"):
        raise GatewayError(
            401,
            "missing or wrong key: send the gateway key (AREAL_GATEWAY_KEY) or the admin token "
            "as 'Authorization: Bearer <key>'",
            code="invalid_api_key",
        )


def _conversation(request: web.Request) -> tuple[OnlineConversations, Conversation]:
    online = _online(request)
    _check_key(request)
    name = request.match_info["name"]
    conversation = online.find(name)
    if conversation is None:
        raise GatewayError(
            404,
            f"no online conversation {name!r} on this gateway (neither a conversation key nor "
            "a session id of one)",
            code="conversation_not_found",
        )
    request[LOG_FIELDS]["session"] = conversation.session.session_id
    return online, conversation


async def _reward(request: web.Request) -> float:
    body: dict[str, Any] = await read_json(request)
    value = reward_value(body.get("reward"), required=True)
    assert value is not None
    return value
