"""``GET /rl/sessions/{id}/trace``: what an open episode did, for ``areal probe``.

A user wiring a new agent needs to know, before hours of compute: did the agent use the URL and
key it was given, which model name it asked for, how many calls it made, whether tool calls were
parsed from what the policy wrote, and whether its turns extend each other token for token (one
training sample) or split (and where the prefix broke, decoded, so the cause can be seen: a
template that re-renders history, an agent that edits or drops earlier messages).

Tool calls are re-parsed from the recorded output tokens with the policy's own parser, the one
the protocol handlers used. The route takes the admin token or the session's key; a session that
has ended has handed its completions to the trainer, so it is traced while open.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiohttp import web

from areal.core.trajectory import join_report
from areal.core.types import Completion
from areal.gateway.errors import GatewayError
from areal.gateway.gateway_state import GatewayState, state_of
from areal.gateway.session_api import session_for

SNIPPET_TOKENS = 12  # decoded tokens shown on each side of a split's break


def add_routes(app: web.Application, prefixes: tuple[str, ...]) -> None:
    for prefix in prefixes:
        app.router.add_get(f"{prefix}/sessions/{{session_id}}/trace", trace)


async def trace(request: web.Request) -> web.Response:
    state = state_of(request)
    session = session_for(state.sessions, request)
    if not session.is_open:
        raise GatewayError(
            409,
            f"session {session.session_id} has ended; trace a session before ending it",
            code="session_ended",
        )
    return web.json_response(
        {
            "session_id": session.session_id,
            "policy_model": state.policy.model_id,
            "calls": session.calls,
            "aborted": session.aborted,
            "turns": describe_turns(state, session.completions),
        }
    )


def describe_turns(state: GatewayState, completions: Sequence[Completion]) -> list[dict[str, Any]]:
    """One entry per recorded completion: sizes, tool calls, and how it joined the samples."""
    by_turn = sorted(completions, key=lambda c: c.turn)
    tokenizer = state.policy.tokenizer
    turns = []
    previous: list[int] = []
    for completion, join in zip(by_turn, join_report(by_turn), strict=True):
        text = tokenizer.decode(completion.output_ids, skip_special_tokens=True)
        parsed = state.policy.tool_parser.parse(text)
        entry: dict[str, Any] = {
            "turn": completion.turn,
            "prompt_tokens": len(completion.prompt_ids),
            "output_tokens": len(completion.output_ids),
            "finish_reason": completion.finish_reason,
            "tool_calls": [call.name for call in parsed.tool_calls],
            "join": join.how,
            "sample": join.sample,
        }
        if join.diverged_at is not None:
            at = join.diverged_at
            entry["diverged_at"] = at
            entry["expected"] = _around(tokenizer, previous, at)
            entry["got"] = _around(tokenizer, completion.prompt_ids, at)
        turns.append(entry)
        previous = list(completion.prompt_ids) + list(completion.output_ids)
    return turns


def _around(tokenizer: Any, ids: Sequence[int], at: int) -> dict[str, Any]:
    """The decoded tokens just before ``at`` and from ``at`` on (what differs starts there), and
    the ids from ``at`` on: when both sides decode alike, only the ids show the difference (a
    generated output that does not survive decode -> re-encode, e.g. a split UTF-8 character)."""
    return {
        "before": tokenizer.decode(list(ids[max(0, at - SNIPPET_TOKENS) : at])),
        "after": tokenizer.decode(list(ids[at : at + SNIPPET_TOKENS])),
        "ids": list(ids[at : at + 4]),
    }
