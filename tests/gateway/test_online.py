"""Online agents (``--online``): an agent calls with the plain gateway key and never opens a
session; the gateway records its conversations under the staleness budget and trains on them once
rewarded. A real gateway and embedded engine on 127.0.0.1, the real ``openai`` and ``anthropic``
SDKs, and a real ZeroMQ trajectory queue on the trainer's side."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import anthropic
import httpx
import openai
import pytest

from areal.core.staleness import StalenessBudget
from areal.core.types import Trajectory
from areal.gateway.server import OnlineSettings
from areal.plugins.queues.zmq_queue import ZmqTrajectorySource
from support import eventually
from support.gateway import RunningGateway
from support.http import group_metadata

Start = Callable[..., AbstractContextManager[RunningGateway]]
TOKENS = 4  # per call: small and quick


@contextmanager
def online_gateway(
    start_gateway: Start, online: OnlineSettings | None, **options: Any
) -> Iterator[tuple[RunningGateway, ZmqTrajectorySource, openai.OpenAI]]:
    """A gateway whose episodes go to a real ZeroMQ queue, and an SDK client with the plain key."""
    with ZmqTrajectorySource("tcp://127.0.0.1:*", queue_max_size=8) as source:
        sink = {"sink": "zmq", "sink_options": {"address": source.address}}
        with (
            start_gateway(online=online, **sink, **options) as gw,
            openai.OpenAI(base_url=gw.v1, api_key=gw.key, max_retries=0, timeout=60) as client,
        ):
            yield gw, source, client


def ask(client: openai.OpenAI, messages: list[dict[str, Any]], **extra: Any) -> Any:
    """One chat call; the raw answer (headers) and the parsed completion."""
    raw = client.chat.completions.with_raw_response.create(
        model="areal-tiny",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=TOKENS,
        temperature=1.0,
        **extra,
    )
    return raw, raw.parse()


def turns(client: openai.OpenAI, conversation: str, n: int) -> list[Any]:
    """``n`` turns of one conversation named by the header, each extending the last."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"hello from {conversation}"}]
    answers = []
    for i in range(n):
        raw, completion = ask(
            client, messages, extra_headers={"x-areal-conversation": conversation}
        )
        assert raw.headers["x-areal-recorded"] == "true"
        assert raw.headers["x-areal-conversation"] == conversation
        assert raw.headers["x-areal-session"].startswith("s_")
        answers.append((raw, completion))
        messages += [
            {"role": "assistant", "content": completion.choices[0].message.content},
            {"role": "user", "content": f"and turn {i + 2}?"},
        ]
    return answers


def rl(gw: RunningGateway, path: str, body: Any = None, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key or gw.key}"}
    if body is None:
        return httpx.get(f"{gw.url}/rl{path}", headers=headers, timeout=30)
    return httpx.post(f"{gw.url}/rl{path}", json=body, headers=headers, timeout=30)


def conversation_in(gw: RunningGateway, name: str, status: str) -> dict[str, Any]:
    """The status of conversation ``name`` once it is ``status`` (its reaper moves it there)."""

    def reached() -> dict[str, Any]:
        answer = rl(gw, f"/conversations/{name}")
        assert answer.status_code == 200, answer.text
        data: dict[str, Any] = answer.json()
        assert data["status"] == status, data
        return data

    return eventually(reached, 30, f"conversation {name!r} to be {status!r}")


def output_tokens(trajectory: Trajectory) -> int:
    return sum(sample.generated_tokens for sample in trajectory.samples)


def test_two_conversations_multi_turn_rewarded_reach_the_queue(start_gateway: Start) -> None:
    with online_gateway(start_gateway, OnlineSettings()) as (gw, source, client):
        first = turns(client, "conv-a", 2)
        second = turns(client, "conv-b", 3)
        sessions = {raw.headers["x-areal-session"] for raw, _ in first + second}
        assert len(sessions) == 2  # one session per conversation, later turns joined it
        # A streamed turn is recorded too, and says so in its headers.
        stream = client.chat.completions.with_raw_response.create(
            model="areal-tiny",
            messages=[{"role": "user", "content": "hello from conv-a"}],
            max_tokens=TOKENS,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"x-areal-conversation": "conv-a"},
        )
        assert stream.headers["x-areal-session"] == first[0][0].headers["x-areal-session"]
        streamed = [chunk.usage.completion_tokens for chunk in stream.parse() if chunk.usage]

        listing = rl(gw, "/conversations", key=gw.admin).json()
        assert {c["conversation"] for c in listing["open"]} == {"conv-a", "conv-b"}
        assert listing["budget"]["running"] == 2

        ended_a = rl(gw, "/conversations/conv-a/end", {"reward": 1.0})
        assert ended_a.status_code == 200 and ended_a.json()["status"] == "ended", ended_a.text
        session_b = second[0][0].headers["x-areal-session"]
        ended_b = rl(gw, f"/conversations/{session_b}/end", {"reward": -0.5})  # by session id
        assert ended_b.json()["sent"] is True, ended_b.text
        got = {
            t.metadata["conversation"]: t for t in (source.get(timeout=30) for _ in range(2)) if t
        }
        assert rl(gw, "/conversations/conv-a/end", {"reward": 1.0}).status_code == 409
    assert set(got) == {"conv-a", "conv-b"}
    a, b = got["conv-a"], got["conv-b"]
    assert (a.reward, b.reward, a.completions, b.completions) == (1.0, -0.5, 3, 3)
    assert a.metadata["online"] is True and b.session_id == session_b
    used_a = sum(c.usage.completion_tokens for _, c in first) + sum(streamed)
    assert output_tokens(a) == used_a
    assert output_tokens(b) == sum(c.usage.completion_tokens for _, c in second)
    assert all((s.versions[s.loss_mask == 1] >= 0).all() for s in a.samples)
    assert [s.reward for s in b.samples] == [-0.5] * len(b.samples)


def test_an_idle_conversation_ends_and_a_reward_by_completion_id_trains_it(
    start_gateway: Start,
) -> None:
    settings = OnlineSettings(idle_timeout=0.4, reward_wait=30)
    with online_gateway(start_gateway, settings) as (gw, source, client):
        # No header: the client's own hint (prompt_cache_key) keys the conversation.
        raw, completion = ask(
            client,
            [{"role": "user", "content": "hi"}],
            extra_body={"prompt_cache_key": "agent-7"},
        )
        assert raw.headers["x-areal-conversation"] == "agent-7"
        awaiting = conversation_in(gw, "agent-7", "awaiting")
        assert awaiting["completions"] == 1 and awaiting["reward"] is None
        assert source.buffered == 0  # ended, but nothing trained without a reward
        missing = rl(gw, "/completions/chatcmpl-nope/reward", {"reward": 1.0})
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "completion_not_found"
        bad = rl(gw, f"/completions/{completion.id}/reward", {"reward": "high"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "reward"
        rewarded = rl(gw, f"/completions/{completion.id}/reward", {"reward": 0.75})
        assert rewarded.status_code == 200 and rewarded.json()["status"] == "ended"
        trajectory = source.get(timeout=30)
    assert trajectory is not None and trajectory.reward == 0.75
    assert trajectory.metadata["conversation"] == "agent-7"
    assert output_tokens(trajectory) == completion.usage.completion_tokens


def test_without_a_reward_in_time_the_conversation_is_discarded(start_gateway: Start) -> None:
    settings = OnlineSettings(idle_timeout=0.3, reward_wait=0.4)
    with online_gateway(start_gateway, settings) as (gw, source, client):
        ask(
            client, [{"role": "user", "content": "hi"}], extra_headers={"x-areal-conversation": "c"}
        )
        assert rl(gw, "/conversations", key=gw.admin).json()["budget"]["running"] == 1
        discarded = conversation_in(gw, "c", "discarded")
        assert discarded["sent"] is False
        listing = rl(gw, "/conversations", key=gw.admin).json()
        late = rl(gw, "/conversations/c/reward", {"reward": 1.0})
    assert listing["budget"]["running"] == 0 and listing["budget"]["accepted"] == 0
    assert listing["counts"]["discarded"] == 1 and listing["awaiting"] == []
    assert late.status_code == 409 and late.json()["error"]["code"] == "conversation_ended"
    assert source.received == 0  # (the gateway's sink delivered all it sent before it closed)


def test_a_full_budget_is_a_429_in_each_schema_never_an_unrecorded_answer(
    start_gateway: Start,
) -> None:
    budget = StalenessBudget(max_concurrent=1)
    with online_gateway(start_gateway, OnlineSettings(), budget=budget) as (gw, source, client):
        ask(
            client,
            [{"role": "user", "content": "hi"}],
            extra_headers={"x-areal-conversation": "one"},
        )
        with pytest.raises(openai.RateLimitError) as full:
            ask(client, [{"role": "user", "content": "hi"}], extra_headers={"x-areal-conversation": "two"})  # fmt: skip
        assert int(full.value.response.headers["Retry-After"]) >= 1
        assert full.value.code == "staleness_budget_full"
        with (
            anthropic.Anthropic(base_url=gw.url, api_key=gw.key, max_retries=0) as claude,
            pytest.raises(anthropic.RateLimitError) as full_too,
        ):
            claude.messages.create(
                model="areal-tiny",
                max_tokens=TOKENS,
                messages=[{"role": "user", "content": "hi"}],
                extra_headers={"x-claude-code-session-id": "claude-1"},
            )
        assert full_too.value.response.json()["error"]["type"] == "rate_limit_error"
        # The open conversation still takes its turns; a call with no key at all is served,
        # unrecorded, and says so.
        ask(client, [{"role": "user", "content": "again"}], extra_headers={"x-areal-conversation": "one"})  # fmt: skip
        plain, _ = ask(client, [{"role": "user", "content": "anonymous"}])
        assert plain.headers["x-areal-recorded"] == "false"
        assert "x-areal-session" not in plain.headers
        assert rl(gw, "/conversations/one/end", {"reward": 1.0}).json()["sent"] is True
        assert source.get(timeout=30) is not None
        # The slot is free again: an Anthropic conversation (Claude Code's session header).
        with anthropic.Anthropic(base_url=gw.url, api_key=gw.key, max_retries=0) as claude:
            raw = claude.messages.with_raw_response.create(
                model="areal-tiny",
                max_tokens=TOKENS,
                messages=[{"role": "user", "content": "hi"}],
                extra_headers={"x-claude-code-session-id": "claude-1"},
            )
        message = raw.parse()
        assert raw.headers["x-areal-conversation"] == "claude-1"
        assert rl(gw, f"/completions/{message.id}/reward", {"reward": 2.0}).status_code == 200
        assert rl(gw, "/conversations/claude-1/end", {}).json()["status"] == "ended"
        trajectory = source.get(timeout=30)
    assert trajectory is not None and trajectory.reward == 2.0
    assert output_tokens(trajectory) == message.usage.output_tokens


def test_without_online_plain_key_calls_are_served_and_not_recorded(start_gateway: Start) -> None:
    with online_gateway(start_gateway, None) as (gw, source, client):
        raw, completion = ask(
            client, [{"role": "user", "content": "hi"}], extra_headers={"x-areal-conversation": "x"}
        )
        assert completion.choices[0].message.content is not None
        assert raw.headers["x-areal-recorded"] == "false"
        assert "x-areal-conversation" not in raw.headers
        off = rl(gw, "/conversations/x/end", {"reward": 1.0})
        assert off.status_code == 404 and off.json()["error"]["code"] == "online_off"
        assert rl(gw, "/sessions", key=gw.admin).json()["open"] == []
    assert source.received == 0  # (the gateway's sink delivered all it sent before it closed)


def test_conversation_routes_refuse_unknown_ids_bad_bodies_and_missing_keys(
    start_gateway: Start,
) -> None:
    with online_gateway(start_gateway, OnlineSettings()) as (gw, _, client):
        ask(
            client, [{"role": "user", "content": "hi"}], extra_headers={"x-areal-conversation": "k"}
        )
        unknown = rl(gw, "/conversations/nope/end", {"reward": 1.0})
        assert unknown.status_code == 404
        assert unknown.json()["error"]["code"] == "conversation_not_found"
        assert rl(gw, "/conversations/k/end", {"reward": True}).status_code == 400
        assert rl(gw, "/conversations/k/reward", {}).status_code == 400
        assert rl(gw, "/conversations/k/end", {"discard": "yes"}).status_code == 400
        anonymous = httpx.post(f"{gw.url}/rl/conversations/k/end", json={"reward": 1.0})
        assert anonymous.status_code == 401
        assert rl(gw, "/conversations").status_code == 403  # the listing needs the admin token
        assert rl(gw, "/conversations/k/reward", {"reward": 0.5}).json()["status"] == "open"
        assert rl(gw, "/conversations/k/end", {"discard": True}).json()["status"] == "discarded"


def test_a_conversation_too_stale_to_train_starts_over_under_its_key(start_gateway: Start) -> None:
    budget = StalenessBudget(staleness_threshold=0)
    with online_gateway(start_gateway, OnlineSettings(), budget=budget) as (gw, source, client):
        key = {"x-areal-conversation": "long"}
        named = {**key, "x-areal-group": "g"}
        first, _ = ask(client, [{"role": "user", "content": "hi"}], extra_headers=named)
        moved = rl(gw, "/version", {"version": 2}, key=gw.admin)  # the trainer moved on
        assert moved.status_code == 200, moved.text
        second, _ = ask(client, [{"role": "user", "content": "and now?"}], extra_headers=key)
        old, new = first.headers["x-areal-session"], second.headers["x-areal-session"]
        assert old != new and second.headers["x-areal-recorded"] == "true"
        stale = rl(gw, f"/conversations/{old}").json()
        assert (stale["status"], stale["stale"], stale["sent"]) == ("discarded", True, False)
        fresh = rl(gw, "/conversations/long").json()
        assert (fresh["session_id"], fresh["group"]) == (new, "online:g")  # its group goes on
    assert source.received == 0  # (the gateway's sink delivered all it sent before it closed)


# --- groups (areal.gateway.online_groups) ----------------------------------------------------------

HI = [{"role": "user", "content": "hi"}]


def test_a_named_group_is_the_episodes_group_in_every_protocol(start_gateway: Start) -> None:
    with online_gateway(start_gateway, OnlineSettings()) as (gw, source, client):
        header = {"x-areal-conversation": "by-header", "x-areal-group": "triage"}
        raw, _ = ask(client, HI, extra_headers=header)
        assert raw.headers["x-areal-group"] == "triage"
        # Later calls repeat the group, or name none: they join.
        ask(client, HI, extra_headers=header)
        again, _ = ask(client, HI, extra_headers={"x-areal-conversation": "by-header"})
        assert again.headers["x-areal-group"] == "triage"
        responses = client.responses.with_raw_response.create(
            model="areal-tiny",
            input="hi",
            max_output_tokens=TOKENS,
            metadata={"areal_group": "triage"},
            extra_headers={"x-areal-conversation": "by-body"},
        )
        assert responses.headers["x-areal-group"] == "triage"
        with anthropic.Anthropic(base_url=gw.url, api_key=gw.key, max_retries=0) as claude:
            message = claude.messages.with_raw_response.create(
                model="areal-tiny",
                max_tokens=TOKENS,
                messages=[{"role": "user", "content": "hi"}],
                metadata=group_metadata("billing"),
                extra_headers={"x-areal-conversation": "claude"},
            )
        assert message.headers["x-areal-group"] == "billing"
        assert rl(gw, "/conversations/by-body").json()["group"] == "online:triage"
        for name, reward in (("by-header", 1.0), ("by-body", 0.0), ("claude", 0.5)):
            assert rl(gw, f"/conversations/{name}/end", {"reward": reward}).json()["sent"]
        got = {t.metadata["conversation"]: t for t in (source.get(timeout=30) for _ in range(3)) if t}  # fmt: skip
    groups = {name: t.metadata["group"] for name, t in got.items()}
    assert groups == {"by-header": "online:triage", "by-body": "online:triage", "claude": "online:billing"}  # fmt: skip
    assert got["by-header"].completions == 3


def test_a_bad_or_conflicting_group_is_a_4xx_in_each_protocols_schema(
    start_gateway: Start,
) -> None:
    with online_gateway(start_gateway, OnlineSettings()) as (gw, _, client):
        key = {"x-areal-conversation": "c1"}
        for bad in ({"metadata": {"areal_group": "has space"}}, {"metadata": {"areal_group": 7}}):
            with pytest.raises(openai.BadRequestError) as refused:
                ask(client, HI, extra_headers=key, extra_body=bad)
            assert refused.value.code == "invalid_group"
            assert refused.value.param == "metadata.areal_group"
        with pytest.raises(openai.BadRequestError, match="x-areal-group header"):
            ask(client, HI, extra_headers={**key, "x-areal-group": "g" * 129})
        with pytest.raises(openai.BadRequestError, match="name one group"):
            ask(client, HI, metadata={"areal_group": "a"}, extra_headers={**key, "x-areal-group": "b"})  # fmt: skip
        assert rl(gw, "/conversations/c1").status_code == 404  # none of them opened it

        ask(client, HI, extra_headers={**key, "x-areal-group": "a"})
        with pytest.raises(openai.ConflictError) as conflict:
            ask(client, HI, extra_headers={**key, "x-areal-group": "b"})
        assert conflict.value.code == "group_conflict" and "'a'" in conflict.value.message
        ask(client, HI, extra_headers=key)  # the conversation goes on, in its group
        status = rl(gw, "/conversations/c1").json()
        assert (status["status"], status["completions"], status["group"]) == ("open", 2, "online:a")  # fmt: skip
        # Named none first: grouped by default, so a later name is a conflict too.
        ask(client, HI, extra_headers={"x-areal-conversation": "c2"})
        with pytest.raises(openai.ConflictError, match="no group"):
            ask(client, HI, extra_headers={"x-areal-conversation": "c2", "x-areal-group": "a"})

        with anthropic.Anthropic(base_url=gw.url, api_key=gw.key, max_retries=0) as claude:
            claude_key = {"x-areal-conversation": "c3"}

            def message(group: object) -> Any:
                return claude.messages.create(
                    model="areal-tiny",
                    max_tokens=TOKENS,
                    messages=[{"role": "user", "content": "hi"}],
                    metadata=group_metadata(group),
                    extra_headers=claude_key,
                )

            with pytest.raises(anthropic.BadRequestError) as bad_claude:
                message("")
            assert bad_claude.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
            message("x")
            with pytest.raises(anthropic.ConflictError) as claude_conflict:
                message("y")
        assert claude_conflict.value.status_code == 409
        assert claude_conflict.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]


@pytest.mark.parametrize("grouping", ["pool", "prompt", "none"])
def test_unnamed_conversations_get_the_default_group_as_they_go_to_the_trainer(
    start_gateway: Start, grouping: str
) -> None:
    settings = OnlineSettings(grouping=grouping, group_size=2)
    with online_gateway(start_gateway, settings) as (gw, source, client):
        questions = {"u1": "what is 2+2?", "u2": "what is 2+2?", "u3": "and 3+3?", "n1": "hi"}
        for name, question in questions.items():
            named = {"x-areal-group": "solo"} if name == "n1" else {}
            headers = {"x-areal-conversation": name, **named}
            ask(client, [{"role": "user", "content": question}], extra_headers=headers)
        assert rl(gw, "/conversations/u1").json()["group"] is None  # given as it is trained
        for name in ("u1", "n1", "u2", "u3"):
            assert rl(gw, f"/conversations/{name}/end", {"reward": 1.0}).json()["sent"]
        ended = rl(gw, "/conversations/u1").json()
        got = {t.metadata["conversation"]: t.metadata for t in (source.get(timeout=30) for _ in range(4)) if t}  # fmt: skip
    groups = {name: meta.get("group") for name, meta in got.items()}
    assert groups["n1"] == "online:solo" and ended["group"] == groups["u1"]
    if grouping == "none":
        assert (groups["u1"], groups["u2"], groups["u3"]) == (None, None, None)
        return
    assert groups["u1"] == groups["u2"] != groups["u3"]  # pool: size 2; prompt: another question
    assert groups["u1"].startswith(f"online~{grouping}-")
