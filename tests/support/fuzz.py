"""The fuzz harness the gateway's property tests share: bad requests, values of every JSON kind
for Hypothesis to draw, malformed bodies, and :func:`send`, which holds an answer to the protocol's
error schema exactly.

A missing route is a failure here, never a 404 that passes: :func:`send` refuses the router's own
"Not Found" unless the caller aims at paths no route has on purpose.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import httpx
import pytest
from hypothesis import settings
from hypothesis import strategies as st

EXAMPLES = 1000
SENT: Counter[str] = Counter()  # requests sent per protocol, to prove the count
API_PREFIXES = ("/v1", "/gateway/v1", "")
RL_PREFIXES = ("/rl", "/gateway/rl")
FUZZ = settings(settings.get_profile("areal-fuzz"), max_examples=EXAMPLES)
MISSING = object()  # a field strategy's way of saying "leave the key out"


class BadRequest:
    """One generated request and what makes it bad (its repr is short: failures print it)."""

    def __init__(
        self,
        why: str,
        path: str,
        body: bytes | None,
        method: str = "POST",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.why, self.path, self.body = why, path, body
        self.method, self.headers = method, headers or {}

    def __repr__(self) -> str:
        body = self.body or b""
        shown = body[:300] + (b"..." if len(body) > 300 else b"")
        return f"<{self.why}: {self.method} {self.path} {shown!r} ({len(body)} bytes)>"


# --- values of every kind ------------------------------------------------------------------------

TEXT = st.text(max_size=12)
HUGE_TEXT = st.integers(2_000, 40_000).map(lambda n: "lorem ipsum dolor " * n)
# NaN and Infinity are not JSON but Python's json writes them; 1e999 is JSON that reads as
# infinity. ``encode`` writes the two markers as the literals 1e999 and -1e999.
OVERFLOW, NEG_OVERFLOW = "<1e999>", "<-1e999>"
NON_FINITE = st.sampled_from([float("nan"), float("inf"), float("-inf"), OVERFLOW, NEG_OVERFLOW])
JUNK_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),  # non-finite ones only where aimed
    TEXT,
)
JUNK = st.recursive(
    JUNK_LEAF,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=8,
)


def junk_except(*kinds: type) -> st.SearchStrategy[Any]:
    """Junk of any JSON type but ``kinds`` (bool counts apart from int)."""

    def ok(value: Any) -> bool:
        if isinstance(value, bool):
            return bool not in kinds
        return not isinstance(value, kinds)

    return JUNK.filter(ok)


NOT_STR = junk_except(str, type(None))
NOT_LIST = junk_except(list, type(None))
NOT_DICT = junk_except(dict, type(None))
NOT_BOOL = junk_except(bool, type(None))
NOT_NUMBER = junk_except(int, float, type(None))
NOT_INT = st.one_of(
    junk_except(int, float, type(None)),
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer()),
    NON_FINITE,
)


def number_outside(low: float, high: float | None) -> st.SearchStrategy[Any]:
    """A wrong number: a non-number, a non-finite one, or one out of ``[low, high]``."""
    options = [
        NOT_NUMBER,
        NON_FINITE,
        st.just(OVERFLOW),
        st.floats(max_value=low, exclude_max=True),
    ]
    if high is not None:
        options.append(st.floats(min_value=high, exclude_min=True, allow_infinity=False))
        options.append(st.integers(min_value=int(high) + 1))
    return st.one_of(*options)


def int_below(low: int) -> st.SearchStrategy[Any]:
    """A wrong count: a non-integer, or an integer under ``low`` (zero and negatives)."""
    return st.one_of(NOT_INT, st.integers(max_value=low - 1))


def unknown_word(known: set[str]) -> st.SearchStrategy[str]:
    words = st.sampled_from(["wizard", "bot", "human", "ai", "User", "SYSTEM"])
    return st.one_of(TEXT, words).filter(lambda w: w not in known)


# --- bodies --------------------------------------------------------------------------------------


def encode(body: Any) -> bytes:
    raw = json.dumps(body, allow_nan=True).encode()
    return raw.replace(b'"<1e999>"', b"1e999").replace(b'"<-1e999>"', b"-1e999")


def malformed(
    base: dict[str, Any],
    *,
    empty_is_object: bool = False,
    extra: tuple[st.SearchStrategy[tuple[str, bytes]], ...] = (),
) -> st.SearchStrategy[tuple[str, bytes]]:
    """Bytes that are not one JSON object: broken JSON, other JSON values, too deep nesting.
    ``empty_is_object``: the server reads an empty body (and ``null``) as ``{}``, so neither is
    malformed there; ``extra``: more cases of the server's own."""
    raw = encode(base)

    def not_json(data: bytes) -> bool:
        if empty_is_object and not data.strip():
            return False
        try:
            json.loads(data)
        except (ValueError, RecursionError):
            return True
        return False

    nulls = [] if empty_is_object else [st.none()]
    not_objects = [st.lists(JUNK, max_size=3), st.integers(), TEXT, *nulls, st.booleans()]
    return st.one_of(
        st.binary(min_size=1, max_size=300).filter(not_json).map(lambda b: ("random bytes", b)),
        st.integers(1, len(raw) - 1).map(lambda k: ("truncated JSON", raw[:k])),
        st.sampled_from([b"}", b"]", b"x", b",", b"{}"]).map(
            lambda tail: ("JSON with trailing bytes", raw + tail)
        ),
        st.just(("invalid UTF-8", raw.replace(b'"', b'"\xff\xfe', 1))),
        st.integers(100_000, 200_000).map(
            lambda d: ("nested too deep", b'{"x": ' + b"[" * d + b"]" * d + b"}")
        ),
        *extra,
        st.one_of(*not_objects).map(lambda v: ("JSON that is not an object", encode(v))),
    )


# --- the answer ----------------------------------------------------------------------------------


# The error types each schema gives a status (the gateway's errors.py, as documented).
ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}
OPENAI_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


def is_anthropic_route(path: str) -> bool:
    """Anthropic's routes answer in its schema; every other route (all of /rl) in OpenAI's."""
    return "/messages" in path and not path.startswith(tuple(p + "/" for p in RL_PREFIXES))


def check_error_schema(status: int, body: Any, req: BadRequest) -> None:
    """Exactly the protocol's error object: its keys, the type its status has, a message."""
    shown = f"not the protocol's error schema for {req}: {body!r}"[:800]
    assert isinstance(body, dict), shown
    if is_anthropic_route(req.path.split("?")[0]):
        assert set(body) == {"type", "error"} and body["type"] == "error", shown
        error = body["error"]
        assert isinstance(error, dict) and set(error) == {"type", "message"}, shown
        assert error["type"] == ANTHROPIC_TYPES.get(status, "invalid_request_error"), shown
    else:
        assert set(body) == {"error"}, shown
        error = body["error"]
        assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}
        assert error["type"] == OPENAI_TYPES.get(status, "invalid_request_error"), shown
        assert error["param"] is None or isinstance(error["param"], str), shown
        assert error["code"] is None or isinstance(error["code"], str), shown
    assert isinstance(error["message"], str) and error["message"].strip(), shown


def send(
    client: httpx.Client, req: BadRequest, protocol: str, *, routed: bool = True
) -> httpx.Response:
    """Send one bad request; the answer must be a 4xx in the protocol's error schema and, when
    ``routed``, come from the route the request aimed at (the router's own 404 means the route
    is missing). A caller that aims at paths no route has on purpose passes ``routed=False``."""
    SENT[protocol] += 1
    try:
        resp = client.request(req.method, req.path, content=req.body, headers=req.headers)
    except httpx.TransportError as err:
        pytest.fail(f"the connection failed for {req}: {err!r}")
    assert 400 <= resp.status_code < 500, f"{resp.status_code} for {req}: {resp.text[:500]}"
    try:
        body = resp.json()
    except ValueError:
        pytest.fail(f"{resp.status_code} without a JSON body for {req}: {resp.text[:300]}")
    check_error_schema(resp.status_code, body, req)
    if routed:
        assert not is_missing_route(resp.status_code, body), f"no route took {req}: {body}"
    return resp


def is_missing_route(status: int, body: Any) -> bool:
    """The router's own answer for a path no route has (the middleware puts aiohttp's
    ``404 Not Found`` in the protocol's schema), not a route's 404 for an unknown id or model."""
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return status == 404 and isinstance(message, str) and message.endswith(": Not Found")
