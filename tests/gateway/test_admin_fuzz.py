"""Property: no bad call of the RL admin API ever gets a 5xx or a dropped connection.

Hypothesis throws at least 1,000 generated bad calls at every ``/rl`` route of a real online
gateway (``--online``) in front of the real embedded engine: the routes are read from the app, so
a new one fails this test until it is fuzzed too. Each call is refused for one reason:

- the wrong key: none, a wrong one, the gateway key or a session key where the admin token is
  needed (401 for no known key, 403 for a known one that may not), another session's key;
- an unknown session, conversation or completion id (404), a method the route does not take
  (405), a path no route has (404);
- a bad body for the engines (a URL that is not one, or that no engine answers at, a bad
  backend, owner, drain or timeout), the trainer seat (every flag of the seat: wrong types and
  ranges, a journal that cannot be opened, bad sampling), the version clock, the discard of
  sessions, a session's or a conversation's reward and end, session creation.

Every answer must be a 4xx in the gateway's own (OpenAI-style) error schema, exactly, and the
gateway must still serve afterwards, with its engine attached, no trainer seat taken and the
version clock where it was. Nothing generated is a valid call: no engine is attached or detached,
no seat taken, no session or conversation ended.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from areal.core.plugins import registry
from areal.gateway.server import OnlineSettings
from areal.gateway.training_flags import sink_names
from support.fuzz import (
    EXAMPLES,
    FUZZ,
    JUNK,
    MISSING,
    NON_FINITE,
    NOT_DICT,
    NOT_INT,
    NOT_NUMBER,
    NOT_STR,
    OVERFLOW,
    RL_PREFIXES,
    TEXT,
    BadRequest,
    encode,
    junk_except,
    malformed,
    send,
)
from support.gateway import RunningGateway, running_gateway
from support.http import bearer

SENT: Counter[str] = Counter()  # calls per route template, to prove every route got its share
TOTAL: Counter[str] = Counter()
# Who may call each route (the template under the /rl and /gateway/rl prefixes).
ADMIN_ONLY = {
    ("GET", "/sessions"),
    ("POST", "/sessions"),
    ("GET", "/version"),
    ("POST", "/version"),
    ("POST", "/sessions/discard"),
    ("GET", "/engines"),
    ("POST", "/engines"),
    ("DELETE", "/engines"),
    ("GET", "/trainer"),
    ("POST", "/trainer"),
    ("DELETE", "/trainer"),
    ("GET", "/conversations"),
}
SESSION_OWN = {  # the admin token, or the session's own key
    ("GET", "/sessions/{session_id}"),
    ("POST", "/sessions/{session_id}/reward"),
    ("POST", "/sessions/{session_id}/end"),
    ("GET", "/sessions/{session_id}/trace"),
}
GATEWAY_KEY = {  # the gateway key or the admin token (online conversations)
    ("GET", "/conversations/{name}"),
    ("POST", "/conversations/{name}/end"),
    ("POST", "/conversations/{name}/reward"),
    ("POST", "/completions/{completion_id}/reward"),
}
ALL_ROUTES = ADMIN_ONLY | SESSION_OWN | GATEWAY_KEY
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH"]
HUGE_LITERAL = "<10**400>"  # an integer literal no float holds (encode_big writes it)
UNREACHABLE = "http://127.0.0.1:1"  # nothing listens on port 1: refused at once


def encode_big(body: Any) -> bytes:
    return encode(body).replace(b'"<10**400>"', b"1" + b"0" * 400)


def seconds_outside(low: float, high: float | None) -> st.SearchStrategy[Any]:
    """A wrong number of seconds: not a number, non-finite, too big for a float, out of range."""
    options = [
        junk_except(int, float, type(None)),
        st.booleans(),
        NON_FINITE,
        st.just(HUGE_LITERAL),
        st.floats(max_value=low, exclude_max=True),
    ]
    if high is not None:
        options += [
            st.floats(min_value=high, exclude_min=True, allow_infinity=False),
            st.integers(min_value=int(high) + 1),
        ]
    return st.one_of(*options)


def count_below(low: int) -> st.SearchStrategy[Any]:
    """A wrong count: not an integer (a bool either), or below ``low``."""
    return st.one_of(NOT_INT, st.booleans(), st.integers(max_value=low - 1))


def bodies(
    base: dict[str, Any], fields: dict[str, st.SearchStrategy[Any]], empty_ok: bool = False
) -> st.SearchStrategy[tuple[str, bytes]]:
    """``base`` with one field made bad (or left out), or malformed bytes; plus, sometimes, keys
    the route does not read (which change nothing). ``empty_ok``: an empty body is ``{}`` there,
    which may be valid, so malformed bytes are never empty."""
    broken = malformed(base)
    if empty_ok:
        broken = broken.filter(lambda wb: wb[1].strip() != b"")
    keys = st.sampled_from(sorted(fields))
    kinds = st.sampled_from(["field", "field", "field", "malformed"])
    noise = st.dictionaries(st.sampled_from(["x_extra", "metadata_", "note"]), JUNK, max_size=2)

    @st.composite
    def build(draw: st.DrawFn) -> tuple[str, bytes]:
        if draw(kinds) == "malformed":
            return draw(broken)
        body = {**json.loads(json.dumps(base)), **draw(noise)}
        key = draw(keys)
        value = draw(fields[key])
        if value is MISSING:
            body.pop(key, None)
            return f"{key} missing", encode_big(body)
        body[key] = value
        return f"bad {key}", encode_big(body)

    return build()


# --- the admin API ------------------------------------------------------------------------------


class World:
    """What the calls aim at: the keys, an open session (and a second one, whose key is the
    wrong one for the first), an online conversation and a completion id it answered with."""

    def __init__(self, gw: RunningGateway, client: httpx.Client, journal_dir: Path) -> None:
        self.gw, self.journal_dir = gw, journal_dir
        self.admin, self.key = bearer(gw.admin), bearer(gw.key)
        opened = [client.post("/rl/sessions", json={}, headers=self.admin) for _ in range(2)]
        assert all(r.status_code == 200 for r in opened), [r.text for r in opened]
        (self.sid, self.skey), (self.other_sid, self.other_key) = (
            (r.json()["session_id"], r.json()["api_key"]) for r in opened
        )
        answer = client.post(
            "/v1/chat/completions",
            headers={**self.key, "x-areal-conversation": "fuzz-conversation"},
            json={
                "model": gw.model,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 1,
            },
        )
        assert answer.status_code == 200, answer.text
        self.conversation = answer.headers["x-areal-conversation"]
        self.completion = answer.json()["id"]
        self.known_ids = {
            self.sid,
            self.other_sid,
            self.conversation,
            self.completion,
            "discard",
            answer.headers["x-areal-session"],
        }


def route_calls(world: World) -> dict[tuple[str, str], st.SearchStrategy[BadRequest]]:
    """Bad calls per route, each refused for its body (with a key that may call the route)."""
    admin = world.admin
    unknown_id = st.one_of(
        st.text(min_size=1, max_size=30),
        st.binary(min_size=8, max_size=8).map(lambda b: "s_" + b.hex()),
        TEXT.map(lambda t: "/messages" + t),  # a decoded %2F: still the RL API's schema
    ).filter(lambda i: i not in world.known_ids)
    not_http = st.one_of(
        NOT_STR,
        st.just(""),
        TEXT.filter(lambda u: not u.startswith(("http://", "https://"))),
        st.sampled_from(["ftp://127.0.0.1", "127.0.0.1:30000", "HTTP://x", "ws://127.0.0.1:1"]),
    )
    bad_urls = st.one_of(  # http(s) URLs no engine answers at, some not even parseable
        st.just(UNREACHABLE),
        st.sampled_from(
            [
                "http://[",
                "http://[::1",
                "http://127.0.0.1:99999",
                "http://:80",
                "http://127.0.0.1:-1",
                "http://127.0.0.1:x",
                "https://",
            ]
        ),
        TEXT.map(lambda t: f"{UNREACHABLE}/{quote(t)}"),
        TEXT.map(lambda t: "http://127.0.0.1:" + t),
        TEXT.map(lambda t: "http://[" + t),
    )
    known_backends = set(registry("inference_backends").names())
    backends = st.one_of(NOT_STR, st.just(""), TEXT.filter(lambda b: b not in known_backends))
    attach = bodies(
        {"url": UNREACHABLE},
        {
            "url": st.one_of(not_http, bad_urls, st.just(MISSING)),
            "backend": backends,
            "owner": st.one_of(NOT_STR, st.just("")),
        },
    )
    detach_fields = {
        "url": st.one_of(not_http, bad_urls, st.just(MISSING)),
        "drain": junk_except(bool, str, type(None)),
        "timeout": seconds_outside(0, 600),
    }
    detach = bodies({"url": UNREACHABLE}, detach_fields, empty_ok=True)
    detach_query = st.fixed_dictionaries(
        {},
        optional={
            "url": st.one_of(TEXT, bad_urls),
            "drain": TEXT,
            "timeout": TEXT.filter(_not_seconds),
        },
    )
    sinks = set(sink_names())
    seat_base = {"trainer_id": "fuzz-trainer", "sink": "none"}
    seat = bodies(
        seat_base,
        {
            "trainer_id": st.one_of(NOT_STR, st.just(""), st.just(MISSING)),
            "sink": st.one_of(NOT_STR, TEXT.filter(lambda s: s not in sinks), st.just("zmq")),
            "sink_address": st.one_of(NOT_STR, st.text(min_size=1, max_size=20)),  # with none
            "staleness_threshold": count_below(0),
            "trigger_batch_size": count_below(1),
            "max_concurrent": count_below(1),
            "version": count_below(0),
            "consumed": count_below(0),
            "dropped": count_below(0),
            "discount": st.one_of(
                NOT_NUMBER,
                st.booleans(),
                st.floats(max_value=0, exclude_max=True),
                st.floats(min_value=1, exclude_min=True),
                st.just(OVERFLOW),
            ),
            "episode_journal": st.one_of(
                NOT_STR,
                st.just(str(world.journal_dir)),  # a directory
                TEXT.map(lambda t: str(world.journal_dir / "no-such-dir" / quote(t, safe=""))),
            ),
            "lease_s": seconds_outside(1, None),
            "sampling": st.one_of(
                NOT_DICT,
                st.dictionaries(
                    TEXT.filter(lambda k: k not in SAMPLING), JUNK, min_size=1, max_size=2
                ),
                st.sampled_from(
                    [
                        {"temperature": -1},
                        {"top_p": 0},
                        {"top_p": 2},
                        {"max_tokens": 0},
                        {"max_tokens": "many"},
                        {"override_client_sampling": "sometimes"},
                        {"temperature": "hot"},
                    ]
                ),
            ),
        },
    )
    leave = bodies(
        {"trainer_id": "nobody-holds-it"},
        {"trainer_id": st.one_of(NOT_STR, st.just(""), TEXT, st.just(MISSING))},
        empty_ok=True,
    )
    version = bodies(
        {"version": 0},
        {
            "version": st.one_of(count_below(0), st.just(MISSING)),
            "consumed": count_below(0),
            "dropped": count_below(0),
            "weights": st.one_of(NOT_STR, st.just("")),
            "trainer_id": JUNK.filter(lambda v: v is not None),  # no trainer holds the seat
        },
    )
    discard = bodies(
        {"metadata": {}},
        {"metadata": st.one_of(NOT_DICT, st.none(), st.just({}), st.just(MISSING))},
    )
    bad_reward = st.one_of(
        junk_except(int, float), NON_FINITE, st.booleans(), st.just(OVERFLOW), st.just(HUGE_LITERAL)
    )
    end = bodies(
        {"discard": False},
        {
            "reward": bad_reward.filter(lambda r: r is not None),
            "discard": junk_except(bool, type(None)),
        },
        empty_ok=True,
    )
    reward = bodies({"reward": 1.0}, {"reward": st.one_of(bad_reward, st.just(MISSING))})
    create = bodies(
        {"metadata": {}},
        {
            "metadata": NOT_DICT,
            "hint": st.one_of(NOT_STR, st.just("")),
            "task_id": junk_except(str, int, bool, type(None)),
            "api_key": st.one_of(
                NOT_STR,
                st.text(max_size=15),
                st.text(min_size=8, max_size=20).map(lambda t: t + " " + t),
                st.sampled_from([world.gw.key, world.gw.admin]),
            ),
            "wait_s": seconds_outside(0, 60),
        },
        empty_ok=True,
    )
    session_keys = st.sampled_from([admin, bearer(world.skey)])
    conversation_keys = st.sampled_from([admin, world.key])
    conv = quote(world.conversation, safe="")

    def on(
        method: str,
        template: str,
        body: st.SearchStrategy[tuple[str, bytes]],
        path: str | None = None,
        keys: st.SearchStrategy[dict[str, str]] = st.just(admin),
    ) -> st.SearchStrategy[BadRequest]:
        where = path or template
        return st.builds(
            lambda wb, key, prefix: BadRequest(wb[0], prefix + where, wb[1], method, key),
            body,
            keys,
            st.sampled_from(RL_PREFIXES),
        )

    def unknown(method: str, template: str, keys: st.SearchStrategy[dict[str, str]]) -> Any:
        field = template[template.index("{") : template.index("}") + 1]
        return st.builds(
            lambda i, key, prefix: BadRequest(
                f"unknown {field}",
                prefix + template.replace(field, quote(i, safe="")),
                encode({"reward": 1.0}) if method == "POST" else None,
                method,
                key,
            ),
            unknown_id,
            keys,
            st.sampled_from(RL_PREFIXES),
        )

    detach_by_query = st.builds(
        lambda q, prefix: BadRequest(
            "bad query", f"{prefix}/engines?{urlencode(q)}", None, "DELETE", admin
        ),
        detach_query.filter(bool),
        st.sampled_from(RL_PREFIXES),
    )
    sid = quote(world.sid, safe="")
    return {
        ("GET", "/sessions"): st.nothing(),  # only keys and methods: with the token it answers
        ("POST", "/sessions"): on("POST", "/sessions", create),
        ("GET", "/version"): st.nothing(),
        ("POST", "/version"): on("POST", "/version", version),
        ("POST", "/sessions/discard"): on("POST", "/sessions/discard", discard),
        ("GET", "/engines"): st.nothing(),
        ("POST", "/engines"): on("POST", "/engines", attach),
        ("DELETE", "/engines"): st.one_of(on("DELETE", "/engines", detach), detach_by_query),
        ("GET", "/trainer"): st.nothing(),
        ("POST", "/trainer"): on("POST", "/trainer", seat),
        ("DELETE", "/trainer"): on("DELETE", "/trainer", leave),
        ("GET", "/conversations"): st.nothing(),
        ("GET", "/sessions/{session_id}"): unknown("GET", "/sessions/{session_id}", st.just(admin)),
        ("POST", "/sessions/{session_id}/reward"): st.one_of(
            unknown("POST", "/sessions/{session_id}/reward", st.just(admin)),
            on("POST", "", reward, f"/sessions/{sid}/reward", session_keys),
        ),
        ("POST", "/sessions/{session_id}/end"): st.one_of(
            unknown("POST", "/sessions/{session_id}/end", st.just(admin)),
            on("POST", "", end, f"/sessions/{sid}/end", session_keys),
        ),
        ("GET", "/sessions/{session_id}/trace"): unknown(
            "GET", "/sessions/{session_id}/trace", st.just(admin)
        ),
        ("GET", "/conversations/{name}"): unknown(
            "GET", "/conversations/{name}", conversation_keys
        ),
        ("POST", "/conversations/{name}/end"): st.one_of(
            unknown("POST", "/conversations/{name}/end", conversation_keys),
            on("POST", "", end, f"/conversations/{conv}/end", conversation_keys),
        ),
        ("POST", "/conversations/{name}/reward"): st.one_of(
            unknown("POST", "/conversations/{name}/reward", conversation_keys),
            on("POST", "", reward, f"/conversations/{conv}/reward", conversation_keys),
        ),
        ("POST", "/completions/{completion_id}/reward"): st.one_of(
            unknown("POST", "/completions/{completion_id}/reward", conversation_keys),
            on(
                "POST",
                "",
                reward,
                f"/completions/{quote(world.completion, safe='')}/reward",
                conversation_keys,
            ),
        ),
    }


SAMPLING = {"temperature", "top_p", "max_tokens", "override_client_sampling"}


def _not_seconds(text: str) -> bool:
    try:
        return not 0 <= float(text) <= 600
    except (ValueError, OverflowError):
        return True


def refused_keys(world: World, method: str, template: str) -> list[tuple[str, dict[str, str], int]]:
    """The keys that may not call a route, each with the status the refusal has."""
    nobody = [("no key", {}, 401), ("a wrong key", bearer("wrong-key-0123456789"), 401)]
    if (method, template) in ADMIN_ONLY:
        return [
            *nobody,
            ("the gateway key", world.key, 403),
            ("a session key", bearer(world.skey), 403),
        ]
    if (method, template) in SESSION_OWN:
        return [
            *nobody,
            ("the gateway key", world.key, 403),
            ("another session's key", bearer(world.other_key), 403),
        ]
    return [*nobody, ("a session key", bearer(world.skey), 401)]


def concrete(world: World, template: str) -> str:
    return (
        template.replace("{session_id}", quote(world.sid, safe=""))
        .replace("{name}", quote(world.conversation, safe=""))
        .replace("{completion_id}", quote(world.completion, safe=""))
    )


def key_calls(world: World) -> st.SearchStrategy[tuple[BadRequest, int]]:
    """Any route, aimed at real ids, with a key that may not call it; and the status due."""
    cases = [
        (method, template, why, key, status)
        for method, template in sorted(ALL_ROUTES)
        for why, key, status in refused_keys(world, method, template)
    ]
    junk_bodies = st.one_of(st.none(), JUNK.map(encode), st.just(encode({"reward": 1.0})))
    return st.builds(
        lambda case, body, prefix: (
            BadRequest(
                f"{case[2]} on {case[0]} {case[1]}",
                prefix + concrete(world, case[1]),
                body if case[0] != "GET" else None,
                case[0],
                case[3],
            ),
            case[4],
        ),
        st.sampled_from(cases),
        junk_bodies,
        st.sampled_from(RL_PREFIXES),
    )


def method_calls(world: World) -> st.SearchStrategy[BadRequest]:
    """A method no route of the path takes (405), with the admin token."""
    by_path: dict[str, set[str]] = {}
    for method, template in ALL_ROUTES:
        by_path.setdefault(template, set()).add(method)
    cases = sorted(
        (template, method)
        for template, taken in by_path.items()
        for method in METHODS
        if method not in taken and (template, method) != ("/sessions/discard", "GET")
    )  # GET /rl/sessions/discard is the status of a session named "discard": a 404
    return st.builds(
        lambda case, prefix: BadRequest(
            f"method {case[1]}", prefix + concrete(world, case[0]), None, case[1], world.admin
        ),
        st.sampled_from(cases),
        st.sampled_from(RL_PREFIXES),
    )


def unknown_paths(world: World) -> st.SearchStrategy[BadRequest]:
    names = st.one_of(
        st.sampled_from(
            [
                "nope",
                "session",
                "engine",
                "versions",
                "trainers",
                "sessions/x/y/z",
                "conversations/x/y",
                "completions/x",
                "engines/x",
            ]
        ),
        st.text(min_size=1, max_size=12).map(lambda t: "x-" + quote(t, safe="")),
    )
    return st.builds(
        lambda n, m, prefix: BadRequest("unknown path", f"{prefix}/{n}", None, m, world.admin),
        names,
        st.sampled_from(METHODS),
        st.sampled_from(RL_PREFIXES),
    )


# --- the property --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def online(
    engine: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningGateway, httpx.Client, World]]:
    logs = tmp_path_factory.mktemp("admin-fuzz-logs")
    with (
        running_gateway(*engine, logs, online=OnlineSettings()) as gw,
        httpx.Client(base_url=gw.url, timeout=30.0) as client,
    ):
        yield gw, client, World(gw, client, tmp_path_factory.mktemp("journals"))


def served_rl_routes(gw: RunningGateway) -> set[tuple[str, str]]:
    """(method, template) of every /rl route the app has (HEAD is aiohttp's own, for GETs)."""
    assert gw.http is not None
    found = set()
    for resource in gw.http.app.router.resources():
        template = resource.canonical
        for route in resource:
            if route.method == "HEAD":
                continue
            for prefix in RL_PREFIXES:
                if template.startswith(prefix + "/"):
                    found.add((route.method, template.removeprefix(prefix)))
    return found


def test_every_rl_route_is_fuzzed(online: tuple[RunningGateway, httpx.Client, World]) -> None:
    gw, _, world = online
    assert served_rl_routes(gw) == ALL_ROUTES
    assert set(route_calls(world)) == ALL_ROUTES


def test_admin_api_bad_calls(online: tuple[RunningGateway, httpx.Client, World]) -> None:
    _, client, world = online
    by_route = route_calls(world)
    keyed = key_calls(world)
    strategy = st.one_of(
        *(
            s.map(lambda r, route=route: (r, None, route))
            for route, s in by_route.items()
            if not s.is_empty
        ),
        keyed.map(lambda rs: (rs[0], rs[1], "key")),
        keyed.map(lambda rs: (rs[0], rs[1], "key")),
        method_calls(world).map(lambda r: (r, 405, "method")),
        unknown_paths(world).map(lambda r: (r, 404, "path")),
    )
    before = TOTAL["admin"]

    @FUZZ
    @given(strategy)
    def prop(case: tuple[BadRequest, int | None, Any]) -> None:
        req, status, route = case
        TOTAL["admin"] += 1
        SENT[str(route)] += 1
        # Paths no route has are aimed at on purpose (unknown paths, ids with a slash); that
        # every route is there is test_every_rl_route_is_fuzzed's to prove.
        resp = send(client, req, "admin", routed=False)
        if status is not None:
            assert resp.status_code == status, f"{resp.status_code}, not {status}, for {req}"

    prop()
    assert TOTAL["admin"] - before >= EXAMPLES
    for route, s in by_route.items():  # each route's bodies or ids got their share
        if not s.is_empty:
            assert SENT[str(route)] >= 10, (route, SENT[str(route)])
    for method, template in sorted(ALL_ROUTES):  # and every route each key it refuses, once more
        for why, key, status in refused_keys(world, method, template):
            req = BadRequest(why, "/rl" + concrete(world, template), None, method, key)
            assert send(client, req, "admin").status_code == status, req


def test_the_gateway_serves_afterwards(online: tuple[RunningGateway, httpx.Client, World]) -> None:
    gw, client, world = online
    engines = client.get("/rl/engines", headers=world.admin).json()["engines"]
    assert len(engines) == 1 and engines[0]["healthy"], engines  # attached as it was
    assert client.get("/rl/trainer", headers=world.admin).json() == {"trainer": None}
    assert client.get("/rl/version", headers=world.admin).json()["version"] == 0
    for sid in (world.sid, world.other_sid):  # open still: no bad call ended them
        status = client.get(f"/rl/sessions/{sid}", headers=world.admin)
        assert status.status_code == 200 and status.json()["status"] == "open", status.text
    conversation = client.get(f"/rl/conversations/{world.conversation}", headers=world.key)
    assert conversation.status_code == 200, conversation.text
    answer = client.post(
        "/v1/chat/completions",
        headers=world.key,
        json={"model": gw.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
    )
    assert answer.status_code == 200, answer.text
    lines = (gw.log_dir / "gateway.log").read_text().splitlines()
    assert not [line for line in lines if " status=5" in line][:3]
