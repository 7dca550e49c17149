"""An engine SIGKILLed in the middle of a streamed chat completion, through a real gateway (both real
processes), with the real openai SDK as the client: the stream ends with a clean error event in
OpenAI's error schema (the SDK raises ``APIError`` with its body), not a hang and not a truncated
success; and the episode it belonged to is discarded, not trained: the gateway's answer to its end
says so, the trajectory file never gets it, and the episode journal counts it discarded.

A control episode streamed before the kill reaches the trajectory file, so the file is watched."""

from __future__ import annotations

import json
import time
from pathlib import Path

import openai
import pytest

from areal.core.episode_journal import EpisodeBooks, read_journal
from areal.plugins.models.tiny import init_tiny
from support.processes import (
    POLICY,
    client,
    end_session,
    open_session,
    start_engine,
    start_gateway,
)


def _end(gateway: str, session: str) -> dict[str, object]:
    answer = end_session(gateway, session)
    answer.raise_for_status()
    return dict(answer.json())


@pytest.mark.slow
@pytest.mark.serial
def test_an_engine_killed_mid_stream_ends_the_stream_cleanly_and_the_episode_untrained(
    tmp_path: Path,
) -> None:
    model = tmp_path / "model"
    init_tiny(model, size="nano", seed=0)
    engine, engine_url = start_engine(model, tmp_path / "logs")
    gateway = None
    try:
        gateway, url = start_gateway(engine_url, tmp_path)
        messages = [{"role": "user", "content": "Count to a thousand."}]

        control, key = open_session(url)
        with client(url, key).chat.completions.create(
            model=POLICY, messages=messages, stream=True, max_tokens=8
        ) as stream:
            assert [c for c in stream if c.choices and c.choices[0].finish_reason]
        assert _end(url, control)["sent"] is True

        cut, key = open_session(url)
        received, error = [], None
        # ignore_eos and a long max_tokens: the stream is still going when the engine dies.
        stream = client(url, key).chat.completions.create(
            model=POLICY,
            messages=messages,
            stream=True,
            max_tokens=3000,
            extra_body={"ignore_eos": True},
        )
        started = time.monotonic()
        try:
            for chunk in stream:
                received.append(chunk)
                if sum(bool(c.choices and c.choices[0].delta.content) for c in received) == 2:
                    engine.kill()  # SIGKILL, mid-stream
        except openai.APIError as err:
            error = err
        took = time.monotonic() - started

        assert engine.returncode is not None, "the stream finished before the engine was killed"
        assert error is not None, f"the stream ended as a success after {len(received)} chunks"
        assert not isinstance(error, openai.APIConnectionError), error  # an event, not a cut
        assert took < 30, took
        body = error.body
        assert isinstance(body, dict), body
        assert set(body) == {"message", "type", "param", "code"}, body  # OpenAI's error object
        assert body["type"] == "server_error" and body["code"] == "engine_lost", body
        assert engine_url in str(body["message"]), body
        assert not any(c.choices and c.choices[0].finish_reason for c in received), received

        # The episode: discarded, not trained.
        ended = _end(url, cut)
        assert ended["sent"] is False and ended["lost_calls"] == 1, ended
        sent = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").open()]
        assert [t["session_id"] for t in sent] == [control], sent
        books = EpisodeBooks()
        read_journal(tmp_path / "episodes.journal", books)
        assert (books.started, books.accepted, books.discarded) == (2, 1, 1), books
    finally:
        if gateway is not None:
            gateway.stop(timeout=5)
        engine.stop(timeout=5)
