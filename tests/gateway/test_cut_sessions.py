"""A session ended while one of its calls is generating (the trainer trained its group without
it and discarded the rest): the call is cut at once, ``409 session_ended`` in the protocol's
error schema (an SSE error event once a stream has begun), and the real engine stops decoding
it. Real gateway, real embedded engine, the real openai SDK as the agent."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from support import eventually
from support.gateway import POLICY

LONG = 3000  # tokens the call asks for: far more than the test waits for
# The policy's own cap on max_tokens, raised so that the long call is taken as asked.
ROUTING = {"model_routing": {"policy_model": {"model_id": POLICY, "max_tokens": LONG}}}


def _open(gw: Any, group: str) -> dict[str, Any]:
    return gw.open_session({"metadata": {"group": group, "group_size": 4}})


def _generating(gw: Any, before: int, call: Future[Any]) -> None:
    """Until the engine runs the call and has made some of its tokens."""

    def started() -> bool:
        assert not call.done(), call.exception() or "the call ended before it generated"
        stats = gw.engine_stats()
        return bool(stats["running"] >= 1 and stats["tokens_generated"] > before)

    eventually(started, 60, "the call generating on the engine")


def _discard(gw: Any, group: str) -> list[str]:
    resp = httpx.post(
        f"{gw.url}/rl/sessions/discard",
        json={"metadata": {"group": group}},
        headers=gw.headers(gw.admin),
    )
    assert resp.status_code == 200, resp.text
    return list(resp.json()["session_ids"])


def _assert_engine_stops(gw: Any, before: int) -> None:
    eventually(lambda: gw.engine_stats()["running"] == 0, 30, "the engine to stop the cut call")
    generated = gw.engine_stats()["tokens_generated"] - before
    assert generated < LONG / 2, f"{generated} tokens: the call was not cut short"


def test_a_running_call_of_a_discarded_session_is_cut(start_gateway: Any) -> None:
    with start_gateway(config=ROUTING) as gw, ThreadPoolExecutor(1) as pool:
        opened = _open(gw, "task-7")
        sent: list[httpx.Request] = []  # every request the agent makes, retries included
        agent = openai.OpenAI(  # retries 409 by default
            base_url=gw.v1,
            api_key=opened["api_key"],
            http_client=httpx.Client(event_hooks={"request": [sent.append]}),
        )
        before = gw.engine_stats()["tokens_generated"]
        call: Future[Any] = pool.submit(
            agent.chat.completions.create,
            model=gw.model,
            messages=[{"role": "user", "content": "count"}],
            max_tokens=LONG,
            extra_body={"ignore_eos": True},
        )
        _generating(gw, before, call)
        assert _discard(gw, "task-7") == [opened["session_id"]]
        with pytest.raises(openai.ConflictError) as refused:
            call.result(timeout=30)
        # Not retried: the answer tells the SDK so (a retry would only get a 401).
        assert refused.value.response.headers["x-should-retry"] == "false"
        assert len(sent) == 1, sent
        assert refused.value.code == "session_ended"
        assert "ended while this call was generating" in refused.value.message
        _assert_engine_stops(gw, before)
        status = httpx.get(
            f"{gw.url}/rl/sessions/{opened['session_id']}", headers=gw.headers(gw.admin)
        ).json()
        assert status["status"] == "ended" and status["sent"] is False


def test_a_streaming_call_of_a_discarded_session_is_cut(start_gateway: Any) -> None:
    with start_gateway(config=ROUTING) as gw:
        opened = _open(gw, "task-8")
        agent = openai.OpenAI(base_url=gw.v1, api_key=opened["api_key"], max_retries=0)
        before = gw.engine_stats()["tokens_generated"]
        stream = agent.chat.completions.create(
            model=gw.model,
            messages=[{"role": "user", "content": "count"}],
            max_tokens=LONG,
            extra_body={"ignore_eos": True},
            stream=True,
        )
        chunks = 0
        with pytest.raises(openai.APIError) as cut:
            for _ in stream:
                chunks += 1
                if chunks == 3:
                    assert _discard(gw, "task-8") == [opened["session_id"]]
        assert "ended while this call was generating" in cut.value.message
        _assert_engine_stops(gw, before)


def test_a_session_ended_with_no_call_running_cuts_nothing(start_gateway: Any) -> None:
    """The common end: the agent's calls are done; ending the session leaves the engine alone."""
    with start_gateway(config=ROUTING) as gw:
        opened = _open(gw, "task-9")
        agent = openai.OpenAI(base_url=gw.v1, api_key=opened["api_key"], max_retries=0)
        answer = agent.chat.completions.create(
            model=gw.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert answer.choices[0].message.content is not None
        sessions = gw.state.sessions
        session = sessions.get(opened["session_id"])
        assert session is not None and not session.engine_calls.calls
        assert _discard(gw, "task-9") == [opened["session_id"]]
        assert session.engine_calls.cut_why is not None  # later calls would be cut at once
