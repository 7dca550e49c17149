"""A session that outlives the staleness bound, against a real gateway and the real engine: its
next turn is refused in the protocol's error schema and the episode ends as discarded, so its
slot frees instead of generating tokens the trainer would drop. The episode journal sees it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from areal.core.episode_journal import EpisodeBooks, read_journal
from areal.core.staleness import StalenessBudget


def _post(url: str, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def _chat(gw: Any, key: str) -> httpx.Response:
    body = {"model": gw.model, "messages": [{"role": "user", "content": "1+1"}], "max_tokens": 4}
    return _post(f"{gw.v1}/chat/completions", key, body)


def _messages(gw: Any, key: str) -> httpx.Response:
    body = {"model": gw.model, "max_tokens": 4, "messages": [{"role": "user", "content": "1+1"}]}
    return _post(f"{gw.v1}/messages", key, body)


def test_a_turn_beyond_the_bound_is_refused_and_the_episode_discarded(
    start_gateway: Any, tmp_path: Path
) -> None:
    journal = tmp_path / "episodes.journal"
    budget = StalenessBudget(trigger_batch_size=1, staleness_threshold=1)
    with start_gateway(budget=budget, episode_journal=journal) as gw:
        opened = _post(f"{gw.url}/rl/sessions", gw.admin, {}).json()
        key, sid = opened["api_key"], opened["session_id"]
        assert _chat(gw, key).status_code == 200  # tokens of version 0
        _post(f"{gw.url}/rl/version", gw.admin, {"version": 1})
        assert _chat(gw, key).status_code == 200  # 1 behind: still within the bound of 1
        assert budget.capacity() == 2  # (1 + 1 + 1) × 1 − 1 running

        _post(f"{gw.url}/rl/version", gw.admin, {"version": 2})  # version 0 is now 2 behind
        refused = _chat(gw, key)
        assert refused.status_code == 410, refused.text
        error = refused.json()["error"]
        assert error["code"] == "session_stale" and error["type"] == "invalid_request_error"
        assert "version 0" in error["message"] and "threshold is 1" in error["message"]

        # The episode ended as discarded: nothing sent, its slot back, its key dead.
        status = httpx.get(f"{gw.url}/rl/sessions/{sid}", headers=gw.headers(gw.admin)).json()
        assert status["status"] == "ended" and status["sent"] is False and status["stale"]
        snap = budget.snapshot()
        assert (snap.running, snap.rejected, snap.capacity) == (0, 1, 4)  # (1 + 2 + 1) × 1
        assert _chat(gw, key).status_code == 401

        # Anthropic's route answers in its own schema.
        other = _post(f"{gw.url}/rl/sessions", gw.admin, {}).json()
        assert _messages(gw, other["api_key"]).status_code == 200
        _post(f"{gw.url}/rl/version", gw.admin, {"version": 4})
        refused = _messages(gw, other["api_key"])
        assert refused.status_code == 410, refused.text
        assert refused.json()["type"] == "error"
        assert "too stale" in refused.json()["error"]["message"]
        assert gw.state.sessions.refused_stale == 2

    books = EpisodeBooks()
    read_journal(journal, books)
    assert (books.boots, books.started, books.rejected, books.running) == (1, 2, 2, 0)


def test_a_session_without_generated_tokens_is_never_stale(start_gateway: Any) -> None:
    budget = StalenessBudget(trigger_batch_size=1, staleness_threshold=0)
    with start_gateway(budget=budget) as gw:
        opened = _post(f"{gw.url}/rl/sessions", gw.admin, {}).json()
        _post(f"{gw.url}/rl/version", gw.admin, {"version": 7})
        assert _chat(gw, opened["api_key"]).status_code == 200
