"""Two session-API additions, against a real gateway and engine: a driver-chosen fixed key (agents
that keep one key per install, like OpenClaw in some setups) and the per-session trace that
``areal probe`` reads (calls, tool calls re-parsed from the recorded tokens, merged/split turns)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from areal.gateway.policy import Generation

FIXED = "openclaw-install-key-0123456789"


def open_session(gw: Any, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{gw.url}/rl/sessions", json=body, headers=gw.headers(gw.admin))


def chat(gw: Any, key: str, content: str = "hi") -> httpx.Response:
    body = {"model": gw.model, "messages": [{"role": "user", "content": content}], "max_tokens": 3}
    return httpx.post(f"{gw.url}/v1/chat/completions", json=body, headers=gw.headers(key))


def end(gw: Any, sid: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{gw.url}/rl/sessions/{sid}/end", json=body, headers=gw.headers(gw.admin))


def trace(gw: Any, sid: str, key: str) -> httpx.Response:
    return httpx.get(f"{gw.url}/rl/sessions/{sid}/trace", headers=gw.headers(key))


def test_a_fixed_key_maps_each_run_to_the_open_episode(gateway: Any) -> None:
    first = open_session(gateway, {"api_key": FIXED, "task_id": "a"}).json()
    assert first["api_key"] == FIXED
    busy = open_session(gateway, {"api_key": FIXED})
    assert busy.status_code == 429 and busy.headers["Retry-After"] == "1"
    assert busy.json()["error"]["code"] == "session_key_busy"
    assert chat(gateway, FIXED).status_code == 200
    assert end(gateway, first["session_id"], {"reward": 1.0}).json()["completions"] == 1
    assert chat(gateway, FIXED).status_code == 401  # between episodes the key is nobody's
    second = open_session(gateway, {"api_key": FIXED, "task_id": "b"}).json()
    assert second["session_id"] != first["session_id"]
    chat(gateway, FIXED)
    chat(gateway, FIXED, "again")
    assert end(gateway, second["session_id"], {"reward": 0.0}).json()["completions"] == 2
    lines = [
        json.loads(x) for x in (gateway.log_dir / "trajectories.jsonl").read_text().splitlines()
    ]
    mine = {t["metadata"]["task_id"]: t["completions"] for t in lines if t["metadata"].get("task_id") in ("a", "b")}  # fmt: skip
    assert mine == {"a": 1, "b": 2}


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("short", "at least 16"),
        ("has a space in it 0123", "whitespace"),
        (12345678901234567, "string"),
    ],
)
def test_bad_fixed_keys_get_a_400_naming_the_field(gateway: Any, key: Any, why: str) -> None:
    resp = open_session(gateway, {"api_key": key})
    assert resp.status_code == 400 and why in resp.json()["error"]["message"]
    assert resp.json()["error"]["param"] == "api_key"


def test_the_gateway_key_cannot_be_a_session_key(gateway: Any) -> None:
    resp = open_session(gateway, {"api_key": gateway.state.gateway_key})
    assert resp.status_code == 400 and "differ from the gateway key" in resp.text


def test_the_trace_lists_calls_tool_calls_and_where_a_prefix_broke(gateway: Any) -> None:
    s = open_session(gateway, {}).json()
    key, sid = s["api_key"], s["session_id"]
    assert chat(gateway, key, "hello there").status_code == 200
    bad = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={"model": gateway.model, "messages": "not a list"},
        headers=gateway.headers(key),
    )
    assert bad.status_code == 400
    # A completion whose output is a Hermes tool call, recorded as the engine would have produced
    # it (the tiny policy writes no tool calls by itself); its prompt is not an extension of turn 0.
    tokenizer = gateway.state.policy.tokenizer
    text = '<tool_call>\n{"name": "calculator", "arguments": {"expr": "1+1"}}\n</tool_call>'
    out = tokenizer.encode(text, add_special_tokens=False)
    prompt = tokenizer.encode("a different prompt", add_special_tokens=False)
    gen = Generation(text, out, [-0.5] * len(out), [0] * len(out), prompt, finish_reason="stop")
    session = gateway.state.sessions.get(sid)
    gateway.run(gateway.state.sessions.record(session, model=gateway.model, generation=gen))

    got = trace(gateway, sid, key)
    assert got.status_code == 200, got.text
    data = got.json()
    assert [(c["path"], c["status"]) for c in data["calls"]] == [
        ("/v1/chat/completions", 200),
        ("/v1/chat/completions", 400),
    ]
    assert data["calls"][0]["model"] == gateway.model and data["policy_model"] == gateway.model
    first, second = data["turns"]
    assert first["join"] == "start" and first["tool_calls"] == []
    assert second["tool_calls"] == ["calculator"] and second["join"] == "split"
    assert second["diverged_at"] == 0 and second["got"]["after"].startswith("a different")
    assert end(gateway, sid, {"discard": True}).status_code == 200
    assert trace(gateway, sid, gateway.admin).status_code == 409  # ended: traced while open


def test_a_session_key_traces_only_its_own_session(gateway: Any) -> None:
    a, b = open_session(gateway, {}).json(), open_session(gateway, {}).json()
    assert trace(gateway, a["session_id"], b["api_key"]).status_code == 403
    assert trace(gateway, a["session_id"], gateway.admin).status_code == 200
    for s in (a, b):
        end(gateway, s["session_id"], {"discard": True})


def test_rendering_reuses_the_episodes_tokens_for_the_text_they_decode_to(gateway: Any) -> None:
    """Three newlines generated one token each re-encode as fewer, merged tokens; given the
    episode's tokens, the next prompt extends them exactly, and only its new text is tokenized.
    An edited history falls back to tokenizing the whole chat."""
    policy = gateway.state.policy
    newline = policy.tokenizer.encode("\n", add_special_tokens=False)
    assert len(newline) == 1
    chat = [{"role": "user", "content": "Say nothing."}]
    history = policy.render(chat) + newline * 3
    turn2 = [*chat, {"role": "assistant", "content": "\n\n\n"}, {"role": "user", "content": "ok"}]
    plain = policy.render(turn2)
    assert plain[: len(history)] != history  # the tokenizer merges the newlines its own way
    reused = policy.render(turn2, history=history)
    assert reused[: len(history)] == history
    assert policy.tokenizer.decode(reused) == policy.tokenizer.decode(plain)  # the same text
    edited = [*chat, {"role": "assistant", "content": "\n"}, {"role": "user", "content": "ok"}]
    assert policy.render(edited, history=history) == policy.render(edited)
