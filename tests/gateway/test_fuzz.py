"""Property: no bad request ever gets a 5xx or a dropped connection from the gateway.

Hypothesis throws at least 1,000 generated bad requests per protocol (OpenAI Chat Completions,
Anthropic Messages, Anthropic count_tokens, OpenAI Responses, the RL session API; the admin API
is in test_admin_fuzz.py) at a real gateway in front of the real embedded engine. Every generated request starts from a valid one and carries at least one change
that the protocol forbids (malformed or non-object JSON, a wrong type or range for some field, an
unknown role, empty messages, bad tool schemas, a bad tool_choice, a bad max_tokens, an unknown
model ...), and may also carry noise a real client sends (unknown keys with nested garbage, huge
strings, a huge max_tokens). The answer must be a 4xx in the protocol's own error schema, and the
gateway must be healthy afterwards. The error schema is checked exactly: its keys, and the
error type each status has. Valid requests keep ``max_tokens`` at 1, so a request the
gateway wrongly accepts fails fast (as a 200) instead of generating for long.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from areal.gateway.chat_messages import HOSTED_TOOL_TYPE
from support.fuzz import (
    API_PREFIXES,
    EXAMPLES,
    FUZZ,
    HUGE_TEXT,
    JUNK,
    JUNK_LEAF,
    MISSING,
    NON_FINITE,
    NOT_BOOL,
    NOT_DICT,
    NOT_INT,
    NOT_LIST,
    NOT_STR,
    RL_PREFIXES,
    SENT,
    TEXT,
    BadRequest,
    encode,
    int_below,
    junk_except,
    malformed,
    number_outside,
    send,
    unknown_word,
)
from support.http import bearer


@dataclass
class Target:
    """What the strategies need to know about the running gateway."""

    key: str
    admin: str
    model: str
    session_id: str | None = None  # an open RL session the session-API requests aim at
    session_key: str | None = None


def unknown_model(target: Target) -> st.SearchStrategy[str]:
    return st.text(min_size=1, max_size=40).filter(lambda m: m not in (target.model, "default"))


# --- bodies --------------------------------------------------------------------------------------


NOISE_KEYS = [
    "metadata",
    "store",
    "thinking",
    "context_management",
    "service_tier",
    "prompt_cache_key",
    "x_garbage",
    "extra",
    "unknown",
    "betas",
]
NOISE_KEY_LISTS = st.lists(st.sampled_from(NOISE_KEYS), max_size=3, unique=True)
# "One in n": the middle value of a range, since Hypothesis draws the ends of ranges far more
# often than 1/n (it hunts for edge cases there).
ONE_IN = {n: st.integers(1, n).map(lambda i, n=n: i == n // 2) for n in (10, 20, 50)}
HUGE_INT = st.integers(10**5, 10**30)
KINDS = st.sampled_from(
    ["field", "malformed", "extra", "field", "extra", "field", "malformed", "extra", "field"]
)


# Values for unknown keys: nested, but cheaper to draw than JUNK (noise rides on most examples).
NOISE_VALUES = st.one_of(
    JUNK_LEAF,
    st.lists(JUNK_LEAF, max_size=3),
    st.dictionaries(TEXT, st.lists(JUNK_LEAF, max_size=2) | JUNK_LEAF, max_size=3),
)


def add_noise(draw: st.DrawFn, body: dict[str, Any], protected: set[str], budget: str) -> str:
    """Add what real clients also send, keeping ``protected`` keys as they are; say what."""
    added = []
    for key in draw(NOISE_KEY_LISTS):
        if key not in protected:
            body[key] = draw(NOISE_VALUES)
            added.append(key)
    if budget not in protected and draw(ONE_IN[10]):
        body[budget] = draw(HUGE_INT)
        added.append(f"huge {budget}")
    if draw(ONE_IN[20]):
        body["x_huge"] = draw(HUGE_TEXT)
        added.append("huge string")
    return f" (+ {', '.join(added)})" if added else ""


def bad_bodies(
    base: dict[str, Any],
    fields: dict[str, st.SearchStrategy[Any]],
    budget: str,
    extra: list[st.SearchStrategy[tuple[str, dict[str, Any]]]],
) -> st.SearchStrategy[tuple[str, bytes]]:
    """``base`` made bad: malformed bytes, one field set to a value the protocol forbids, or one
    of the protocol's own structural mistakes (``extra``), plus noise. The strategies are built
    once here: building them per example would cost more than sending the requests."""
    broken = malformed(base)
    keys = st.sampled_from(sorted(fields))
    mistakes = st.one_of(*extra)
    kept = set(base) - {budget}

    @st.composite
    def build(draw: st.DrawFn) -> tuple[str, bytes]:
        body = json.loads(json.dumps(base))
        kind = draw(KINDS)
        if kind == "malformed":
            return draw(broken)
        if kind == "field":
            key = draw(keys)
            value = draw(fields[key])
            if value is MISSING:
                body.pop(key, None)
                why = f"{key} missing"
            else:
                body[key] = value
                why = f"bad {key}"
            protected = {key}
        else:
            why, changes = draw(mistakes)
            body.update(changes)
            protected = set(changes)
        why += add_noise(draw, body, protected | kept, budget)
        return why, encode(body)

    return build()


def with_messages(
    message: st.SearchStrategy[Any], label: str, key: str = "messages"
) -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
    """A conversation whose one bad turn sits among good ones."""
    good = {"role": "user", "content": "hello"}
    return st.tuples(message, st.integers(0, 2), st.integers(0, 2)).map(
        lambda t: (label, {key: [good] * t[1] + [t[0]] + [good] * t[2]})
    )


# --- OpenAI Chat Completions ---------------------------------------------------------------------

CHAT_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


def openai_bad_tools() -> st.SearchStrategy[Any]:
    fn_name = st.one_of(NOT_STR, st.just(""))
    return st.one_of(
        NOT_LIST,
        st.lists(junk_except(dict), min_size=1, max_size=3),
        st.builds(  # a hosted tool's type (web_search, ...) is left out; any other is a 400
            lambda t: [{"type": t, "function": {"name": "f"}}],
            TEXT.filter(lambda t: not HOSTED_TOOL_TYPE.fullmatch(t)),
        ),
        st.builds(lambda f: [{"type": "function", "function": f}], NOT_DICT),
        st.builds(lambda n: [{"type": "function", "function": {"name": n}}], fn_name),
        st.builds(
            lambda p: [{"type": "function", "function": {"name": "f", "parameters": p}}], NOT_DICT
        ),
        st.builds(
            lambda t: [{"type": "function", "function": {"name": "f", "parameters": {"type": t}}}],
            st.sampled_from(["string", "array", "integer", "null", 3, None]),
        ),
        st.just([{"type": "function", "function": {"name": "f"}}] * 2),  # defined twice
    )


def openai_bad_tool_choice() -> st.SearchStrategy[Any]:
    return st.one_of(
        TEXT.filter(lambda s: s not in ("none", "auto", "required", "any")),
        junk_except(str, dict, type(None)),
        st.just("required"),  # no tools to call
        st.builds(lambda n: {"type": "function", "function": {"name": n}}, TEXT),
        st.dictionaries(TEXT, JUNK, max_size=3).filter(
            lambda d: "function" not in d and d.get("type") not in ("none", "auto", "required")
        ),
    )


def openai_bad_message() -> st.SearchStrategy[Any]:
    return st.one_of(
        junk_except(dict),
        st.builds(lambda r: {"role": r, "content": "hi"}, unknown_word(CHAT_ROLES)),
        st.builds(lambda r: {"role": r, "content": "hi"}, NOT_STR | st.none()),
        st.just({"content": "no role"}),
        st.builds(lambda c: {"role": "user", "content": c}, junk_except(str, list, type(None))),
        st.builds(lambda p: {"role": "user", "content": [p]}, junk_except(str, dict)),
        st.builds(
            lambda t: {"role": "user", "content": [{"type": t, "text": "x"}]},
            st.sampled_from(["image_url", "input_audio", "video", "file", 7]),
        ),
        st.builds(lambda t: {"role": "user", "content": [{"type": "text", "text": t}]}, NOT_STR),
        st.builds(lambda c: {"role": "assistant", "content": None, "tool_calls": c}, NOT_LIST),
        st.builds(
            lambda c: {"role": "assistant", "content": None, "tool_calls": [c]},
            st.one_of(junk_except(dict), st.just({"id": "c1", "function": {"arguments": "{}"}})),
        ),
    )


def openai_chat_requests(target: Target) -> st.SearchStrategy[BadRequest]:
    base = {"model": target.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    fields: dict[str, st.SearchStrategy[Any]] = {
        "messages": st.one_of(NOT_LIST, st.just([]), st.just(MISSING)),
        "model": st.one_of(NOT_STR, unknown_model(target)),
        "max_tokens": int_below(1),
        "max_completion_tokens": int_below(1),
        "temperature": number_outside(0, 2),
        "top_p": number_outside(0, 1),
        "presence_penalty": number_outside(-2, 2),
        "n": st.one_of(int_below(1), st.integers(min_value=65)),
        "stream": NOT_BOOL,
        "logprobs": NOT_BOOL,
        "top_logprobs": st.one_of(int_below(0), st.integers(min_value=21)),
        "tools": openai_bad_tools(),
        "tool_choice": openai_bad_tool_choice(),
        "stop": st.one_of(
            junk_except(str, list, type(None)), st.lists(junk_except(str), min_size=1, max_size=3)
        ),
        "response_format": st.one_of(
            NOT_DICT,
            st.builds(
                lambda t: {"type": t},
                TEXT.filter(lambda t: t not in ("text", "json_object", "json_schema")),
            ),
            st.builds(lambda s: {"type": "json_schema", "json_schema": s}, NOT_DICT),
        ),
        "stream_options": NOT_DICT,
        "seed": st.one_of(NOT_INT, st.integers(min_value=2**64)),
        "logit_bias": junk_except(dict, type(None)).filter(bool),
    }
    extra = [
        with_messages(openai_bad_message(), "bad message"),
        st.builds(
            lambda n: (
                "tool_choice names a tool that is not there",
                {
                    "tools": [{"type": "function", "function": {"name": "get_weather"}}],
                    "tool_choice": {"type": "function", "function": {"name": n}},
                },
            ),
            TEXT.filter(lambda n: n != "get_weather"),
        ),
    ]
    return requests_for(base, fields, extra, "max_tokens", "/chat/completions", target, bearer)


# --- Anthropic Messages --------------------------------------------------------------------------

ANTHROPIC_ROLES = {"user", "assistant", "system"}


def anthropic_bad_message() -> st.SearchStrategy[Any]:
    block = st.one_of(
        junk_except(dict),
        st.dictionaries(TEXT.filter(lambda k: k != "type"), JUNK, max_size=2),
        st.builds(lambda t: {"type": t}, NOT_STR),
        st.sampled_from(
            [
                {"type": "image", "source": {}},
                {"type": "document", "source": {}},
                {"type": "hologram", "text": "x"},
                {"type": "tool_use", "id": "t", "name": "f", "input": {}},
            ]
        ),
        st.builds(lambda t: {"type": "text", "text": t}, NOT_STR | st.none()),
        st.builds(lambda i: {"type": "tool_result", "tool_use_id": i}, NOT_STR | st.none()),
    )
    return st.one_of(
        junk_except(dict),
        st.builds(lambda r: {"role": r, "content": "hi"}, unknown_word(ANTHROPIC_ROLES)),
        st.builds(lambda r: {"role": r, "content": "hi"}, NOT_STR | st.none()),
        st.builds(lambda c: {"role": "user", "content": c}, junk_except(str, list)),
        st.builds(lambda b: {"role": "user", "content": [b]}, block),
        st.builds(
            lambda u: {"role": "assistant", "content": [u]},
            st.one_of(
                st.builds(
                    lambda i: {"type": "tool_use", "id": i, "name": "f", "input": {}},
                    NOT_STR | st.none(),
                ),
                st.builds(
                    lambda i: {"type": "tool_use", "id": "t", "name": "f", "input": i}, NOT_DICT
                ),
                st.just({"type": "tool_result", "tool_use_id": "t"}),
            ),
        ),
    )


def anthropic_bad_tools() -> st.SearchStrategy[Any]:
    schema = {"type": "object", "properties": {}}
    return st.one_of(
        NOT_LIST,
        st.lists(junk_except(dict), min_size=1, max_size=3),
        st.builds(
            lambda n: [{"name": n, "input_schema": schema}],
            st.one_of(NOT_STR, st.just(""), st.just("has space"), st.just("x" * 200)),
        ),
        st.builds(
            lambda s: [{"name": "f", "input_schema": s}],
            st.one_of(
                NOT_DICT,
                st.none(),
                st.builds(lambda t: {"type": t}, st.sampled_from(["string", "array", None, 1])),
            ),
        ),
        st.builds(
            lambda p: [{"name": "f", "input_schema": {"type": "object", "properties": p}}],
            st.one_of(junk_except(dict, type(None)), st.just({"a": 1})),
        ),
        st.builds(
            lambda r: [{"name": "f", "input_schema": {"type": "object", "required": r}}],
            st.one_of(junk_except(list, type(None)), st.just([1])),
        ),
        st.builds(lambda d: [{"name": "f", "input_schema": schema, "description": d}], NOT_STR),
        st.just([{"name": "f", "input_schema": schema}] * 2),
    )


def anthropic_requests(target: Target, path: str) -> st.SearchStrategy[BadRequest]:
    base = {"model": target.model, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    fields: dict[str, st.SearchStrategy[Any]] = {
        "messages": st.one_of(
            NOT_LIST,
            st.just([]),
            st.just(MISSING),
            st.just([{"role": "assistant", "content": "only a prefill"}]),
        ),
        "model": st.one_of(NOT_STR, unknown_model(target)),
        "system": st.one_of(
            junk_except(str, list, type(None)),
            st.lists(junk_except(dict), min_size=1, max_size=2),
            st.just([{"type": "image"}]),
        ),
        "tools": anthropic_bad_tools(),
        "tool_choice": st.one_of(
            junk_except(dict, type(None)),
            st.builds(
                lambda t: {"type": t},
                TEXT.filter(lambda t: t not in ("auto", "any", "tool", "none")),
            ),
            st.just({"type": "any"}),
            st.builds(lambda n: {"type": "tool", "name": n}, JUNK),
        ),
        "output_config": st.builds(
            lambda f: {"format": f},
            st.one_of(
                junk_except(dict, type(None)),
                st.just({"type": "json_object"}),
                st.builds(lambda s: {"type": "json_schema", "schema": s}, NOT_DICT),
            ),
        ),
    }
    if path == "/messages":  # count_tokens reads only what the prompt is made of
        fields |= {
            "max_tokens": st.one_of(int_below(1), st.floats(), st.just(MISSING)),
            "temperature": number_outside(0, None),
            "top_p": number_outside(0, 1) | st.just(0.0),
            "top_k": int_below(1),
            "stop_sequences": st.one_of(
                junk_except(list, type(None)), st.lists(junk_except(str), min_size=1), st.just([""])
            ),
            "stream": NOT_BOOL,
        }
    extra = [
        with_messages(anthropic_bad_message(), "bad message"),
        st.builds(
            lambda n: (
                "tool_choice names a tool that is not there",
                {
                    "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
                    "tool_choice": {"type": "tool", "name": n},
                },
            ),
            TEXT.filter(lambda n: n != "get_weather"),
        ),
    ]
    return requests_for(base, fields, extra, "max_tokens", path, target, x_api_key)


# --- OpenAI Responses ----------------------------------------------------------------------------


def responses_bad_item() -> st.SearchStrategy[Any]:
    return st.one_of(
        junk_except(dict),
        st.builds(
            lambda t: {"type": t, "role": "user", "content": "x"},
            TEXT.filter(
                lambda t: t not in ("message", "function_call", "function_call_output", "reasoning")
            ),
        ),
        st.builds(
            lambda r: {"type": "message", "role": r, "content": "hi"},
            st.one_of(
                NOT_STR, st.none(), unknown_word({"system", "developer", "user", "assistant"})
            ),
        ),
        st.builds(
            lambda c: {"type": "message", "role": "user", "content": c},
            junk_except(str, list, type(None)),
        ),
        st.builds(
            lambda i: {"type": "function_call", "call_id": i, "name": "f", "arguments": "{}"},
            st.one_of(NOT_STR, st.just("")),
        ),
        st.builds(lambda n: {"type": "function_call", "call_id": "c", "name": n}, NOT_STR),
        st.builds(
            lambda i: {"type": "function_call_output", "call_id": i, "output": "x"},
            st.one_of(NOT_STR, st.none()),
        ),
    )


def responses_requests(target: Target) -> st.SearchStrategy[BadRequest]:
    base = {"model": target.model, "input": "hi", "max_output_tokens": 1}
    fn = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    fields: dict[str, st.SearchStrategy[Any]] = {
        "input": st.one_of(
            junk_except(str, list),
            st.just([]),
            st.just(MISSING),
            st.just([{"type": "reasoning", "summary": []}]),
        ),
        "model": st.one_of(NOT_STR, unknown_model(target)),
        "instructions": NOT_STR,
        "previous_response_id": JUNK.filter(lambda v: v is not None),
        "conversation": JUNK.filter(lambda v: v is not None),
        "background": JUNK.filter(bool),
        "max_output_tokens": int_below(1),
        "temperature": number_outside(0, 2),
        "top_p": number_outside(0, 1),
        "stream": NOT_BOOL,
        "tools": st.one_of(
            NOT_LIST,
            st.lists(junk_except(dict), min_size=1, max_size=2),
            st.builds(lambda t: [{**fn, "type": t}], JUNK.filter(lambda t: t != "function")),
            st.builds(lambda n: [{**fn, "name": n}], st.one_of(NOT_STR, st.just(""))),
            st.builds(lambda p: [{**fn, "parameters": p}], junk_except(dict, type(None))),
            st.just([fn, fn]),
        ),
        "tool_choice": st.one_of(
            TEXT.filter(lambda s: s not in ("none", "auto", "required", "any")),
            st.just("required"),
            st.builds(
                lambda t: {"type": t},
                TEXT.filter(
                    lambda t: t not in ("function", "allowed_tools", "none", "auto", "required")
                ),
            ),
            st.builds(lambda n: {"type": "function", "name": n}, TEXT),
            st.builds(
                lambda t: {"type": "allowed_tools", "mode": "auto", "tools": t},
                st.one_of(NOT_LIST, st.just([]), st.just([{"name": "nope"}])),
            ),
        ),
        "text": st.one_of(
            NOT_DICT,
            st.builds(lambda f: {"format": f}, junk_except(dict, type(None))),
            st.builds(
                lambda t: {"format": {"type": t}},
                TEXT.filter(lambda t: t not in ("text", "json_object", "json_schema")),
            ),
            st.builds(lambda s: {"format": {"type": "json_schema", "schema": s}}, NOT_DICT),
        ),
    }
    extra = [with_messages(responses_bad_item(), "bad input item", key="input")]
    return requests_for(base, fields, extra, "max_output_tokens", "/responses", target, bearer)


# --- requests with keys --------------------------------------------------------------------------


def x_api_key(key: str) -> dict[str, str]:
    return {"x-api-key": key, "anthropic-version": "2023-06-01", "anthropic-beta": "fuzz-1,x"}


CONTENT_TYPES = st.sampled_from(
    [None, "application/json", "text/plain", "application/x-www-form-urlencoded"]
)
METHODS = st.sampled_from(["GET", "PUT", "DELETE", "PATCH"])


def requests_for(
    base: dict[str, Any],
    fields: dict[str, st.SearchStrategy[Any]],
    extra: list[st.SearchStrategy[tuple[str, dict[str, Any]]]],
    budget: str,
    route: str,
    target: Target,
    style: Callable[[str], dict[str, str]],
) -> st.SearchStrategy[BadRequest]:
    """Bad requests for one route, under every prefix, mostly with the gateway key (so the body
    is what is judged) and sometimes with no key, a wrong one, a session key or the admin's."""
    bodies = bad_bodies(base, fields, budget, extra)
    prefixes = st.sampled_from(API_PREFIXES)
    keys = [target.key] * 8 + [target.admin] + ([target.session_key] if target.session_key else [])
    good_keys, bad_keys = st.sampled_from(keys), st.sampled_from(["", "wrong-key"])

    @st.composite
    def build(draw: st.DrawFn) -> BadRequest:
        path = draw(prefixes) + route
        key = draw(bad_keys if draw(ONE_IN[20]) else good_keys)
        headers = style(key) if key else {}
        content_type = draw(CONTENT_TYPES)
        if content_type:
            headers["Content-Type"] = content_type
        label = {"": " [no key]", "wrong-key": " [wrong key]"}.get(key, "")
        if draw(ONE_IN[50]):  # a method the route does not take
            method = draw(METHODS)
            return BadRequest(f"method {method}{label}", path, None, method, headers)
        why, body = draw(bodies)
        return BadRequest(why + label, path, body, "POST", headers)

    return build()


# --- the session API -----------------------------------------------------------------------------


def session_requests(target: Target) -> st.SearchStrategy[BadRequest]:
    """Bad calls of the session API: no or the wrong key, unknown sessions, bad bodies for
    create, reward and end (aimed at one open session, which none of them may end)."""
    admin = bearer(target.admin)
    sid = target.session_id
    # Ids the routes' ``{session_id}`` can match (no brace, no slash, not a dot segment), so that
    # each gets the route's own 404, never the router's.
    other_ids = (
        st.one_of(
            st.text(min_size=1, max_size=40),
            st.binary(min_size=8, max_size=8).map(lambda b: "s_" + b.hex()),
        )
        .filter(lambda i: not set(i) & set("{}/") and i.strip("."))
        .map(lambda i: quote(i, safe=""))
    )
    outsiders = [{}, bearer("wrong-key"), bearer(target.key)]
    non_admins = st.sampled_from(outsiders + ([bearer(target.session_key)] if sid else []))
    kinds = ["create-key", "create-body", "unknown-session", "status-unknown", "list-key"]
    if sid is not None:
        kinds += ["reward-body"] * 3 + ["end-body"] * 3 + ["no-key"]
    create_bodies = st.one_of(
        malformed({"metadata": {}}).filter(lambda wb: wb[1].strip() != b""),
        st.builds(lambda m: ("bad metadata", encode({"metadata": m})), NOT_DICT),
        st.builds(lambda h: ("bad hint", encode({"hint": h})), NOT_STR | st.just("")),
        st.builds(
            lambda t: ("bad task_id", encode({"task_id": t})),
            junk_except(str, int, bool, type(None)),
        ),
    )
    bad_reward = st.one_of(junk_except(int, float), NON_FINITE, st.booleans())
    reward_bodies = st.one_of(
        malformed({"reward": 1.0}),
        st.just(("empty body", b"")),
        st.builds(lambda r: ("bad reward", encode({"reward": r})), bad_reward),
        st.just(("no reward", encode({"completion_id": "c"}))),
        st.builds(
            lambda c: ("bad completion_id", encode({"reward": 1, "completion_id": c})),
            junk_except(str, type(None)),
        ),
        st.builds(
            lambda c: ("unknown completion", encode({"reward": 1, "completion_id": c})), TEXT
        ),
    )
    end_bodies = st.one_of(
        malformed({"discard": True}).filter(lambda wb: wb[1].strip() != b""),
        st.builds(
            lambda r: ("bad reward", encode({"reward": r})),
            bad_reward.filter(lambda r: r is not None),
        ),
        st.builds(lambda d: ("bad discard", encode({"discard": d})), junk_except(bool)),
    )
    own_keys = st.sampled_from(
        [admin] + ([bearer(target.session_key)] if target.session_key else [])
    )
    actions = st.sampled_from(["reward", "end"])
    junk_bodies = st.one_of(st.just(b""), JUNK.map(encode))

    @st.composite
    def build(draw: st.DrawFn) -> BadRequest:
        prefix = draw(st.sampled_from(RL_PREFIXES))
        kind = draw(st.sampled_from(kinds))
        if kind == "create-key":
            return BadRequest(
                "create without the admin token",
                f"{prefix}/sessions",
                draw(junk_bodies),
                headers=draw(non_admins),
            )
        if kind == "list-key":
            return BadRequest(
                "list without the admin token", f"{prefix}/sessions", None, "GET", draw(non_admins)
            )
        if kind == "status-unknown":
            return BadRequest(
                "status of an unknown session",
                f"{prefix}/sessions/{draw(other_ids)}",
                None,
                "GET",
                admin,
            )
        if kind == "create-body":
            why, body = draw(create_bodies)
            return BadRequest(f"create: {why}", f"{prefix}/sessions", body, headers=admin)
        if kind == "unknown-session":
            action = draw(actions)
            return BadRequest(
                f"{action} of an unknown session",
                f"{prefix}/sessions/{draw(other_ids)}/{action}",
                encode({"reward": 1.0}),
                headers=admin,
            )
        if kind == "no-key":
            action = draw(actions)
            return BadRequest(
                f"{action} without a key that may",
                f"{prefix}/sessions/{sid}/{action}",
                encode({"reward": 1.0}),
                headers=draw(st.sampled_from(outsiders)),
            )
        if kind == "reward-body":
            why, body = draw(reward_bodies)
            return BadRequest(
                f"reward: {why}", f"{prefix}/sessions/{sid}/reward", body, headers=draw(own_keys)
            )
        why, body = draw(end_bodies)
        return BadRequest(
            f"end: {why}", f"{prefix}/sessions/{sid}/end", body, headers=draw(own_keys)
        )

    return build()


# --- the property --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(gateway: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=10.0) as c:
        yield c


@pytest.fixture(scope="module")
def target(gateway: Any, client: httpx.Client) -> Target:
    """The gateway's keys, and one open RL session."""
    t = Target(gateway.key, gateway.admin, gateway.model)
    resp = client.post("/rl/sessions", json={}, headers=bearer(gateway.admin))
    assert resp.status_code == 200, resp.text
    t.session_id, t.session_key = resp.json()["session_id"], resp.json()["api_key"]
    return t


def run_property(
    client: httpx.Client, protocol: str, strategy: st.SearchStrategy[BadRequest]
) -> None:
    before = SENT[protocol]

    @FUZZ
    @given(strategy)
    def prop(req: BadRequest) -> None:
        send(client, req, protocol)

    prop()
    assert SENT[protocol] - before >= EXAMPLES


def test_openai_chat_bad_requests(client: httpx.Client, target: Target) -> None:
    run_property(client, "openai-chat", openai_chat_requests(target))


def test_anthropic_messages_bad_requests(client: httpx.Client, target: Target) -> None:
    run_property(client, "anthropic", anthropic_requests(target, "/messages"))


def test_anthropic_count_tokens_bad_requests(client: httpx.Client, target: Target) -> None:
    run_property(client, "count-tokens", anthropic_requests(target, "/messages/count_tokens"))


def test_responses_bad_requests(client: httpx.Client, target: Target) -> None:
    run_property(client, "responses", responses_requests(target))


def test_session_api_bad_requests(client: httpx.Client, target: Target) -> None:
    run_property(client, "sessions", session_requests(target))


OVERFLOW_CASES = [
    *(
        ("/v1/chat/completions", f)
        for f in (
            "temperature",
            "top_p",
            "presence_penalty",
            "frequency_penalty",
            "max_tokens",
            "n",
            "seed",
        )
    ),
    *(("/v1/messages", f) for f in ("temperature", "top_p", "top_k", "max_tokens")),
    *(("/v1/responses", f) for f in ("temperature", "top_p", "max_output_tokens")),
]


@pytest.mark.parametrize(("path", "name"), OVERFLOW_CASES)
def test_numbers_too_large_for_a_float_are_refused(
    client: httpx.Client, target: Target, path: str, name: str
) -> None:
    """``1e999`` is valid JSON that Python reads as infinity; no sampling knob may take it (the
    fuzzer draws it too, but rarely for any one field)."""
    if path.endswith("/responses"):
        base: dict[str, Any] = {"model": target.model, "input": "hi", "max_output_tokens": 1}
    else:
        base = {"model": target.model, "messages": [{"role": "user", "content": "hi"}]}
        base["max_tokens"] = 1
    for literal in ("1e999", "-1e999"):
        body = encode(base)[:-1] + f', "{name}": {literal}}}'.encode()
        req = BadRequest(f"{name}={literal}", path, body, headers=bearer(target.key))
        send(client, req, "overflow")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
def test_oversized_body_is_a_413(client: httpx.Client, target: Target, path: str) -> None:
    body = b'{"x": "' + b"a" * (33 * 1024**2) + b'"}'
    req = BadRequest("oversized body", path, body, headers=bearer(target.key))
    try:
        send(client, req, "oversized")
    except httpx.TransportError as err:  # the gateway may close before reading it all
        pytest.fail(f"the connection dropped on an oversized body: {err!r}")


def test_gateway_is_healthy_afterwards(gateway: Any, client: httpx.Client, target: Target) -> None:
    assert client.get("/health").status_code == 200
    assert client.get("/v1/models", headers=bearer(target.key)).status_code == 200
    resp = client.post(
        "/v1/chat/completions",
        headers=bearer(target.key),
        json={
            "model": target.model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
        },
    )
    assert resp.status_code == 200, resp.text
    status = client.get(f"/rl/sessions/{target.session_id}", headers=bearer(target.admin))
    assert status.status_code == 200, status.text
    lines = (gateway.log_dir / "gateway.log").read_text().splitlines()
    assert not [line for line in lines if " status=5" in line][:3]
