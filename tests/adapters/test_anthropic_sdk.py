"""``anthropic_sdk``: agents written against the real ``anthropic`` SDK reach the gateway's
``/v1/messages`` with the episode's key; rewards arrive per task."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic

import areal
from areal.adapters.anthropic_sdk import AnthropicAdapter


def messages(task: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": task["question"]}]


def test_async_agent(gateway: Any, tasks: Any) -> None:
    async def agent(task: dict[str, Any], client: Any, config: dict[str, Any]) -> float:
        assert isinstance(client, anthropic.AsyncAnthropic)
        assert str(client.base_url).rstrip("/") == gateway.url == config["model_base_url"]
        reply = await client.messages.create(
            model=config["model_name"], max_tokens=3, messages=messages(task)
        )
        assert reply.role == "assistant"
        return float(task["r"])

    adapter = areal.wrap(agent, framework="anthropic_sdk")
    assert isinstance(adapter, AnthropicAdapter)
    stats, got = gateway.run(adapter, tasks)
    assert (stats.finished, stats.sent) == (4, 4)
    assert {k: t.reward for k, t in got.items()} == {"t0": 0.0, "t1": 0.25, "t2": 0.5, "t3": 0.75}
    assert all(t.completions == 1 for t in got.values())


def test_sync_agent_and_own_clients(gateway: Any, tasks: Any, monkeypatch: Any) -> None:
    """A sync agent's client, and a client built from ANTHROPIC_* in another episode, both
    authenticate as their own session (a machine-wide auth token is not used)."""
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "a-machine-oauth-token")

    def sync_agent(task: dict[str, Any], client: Any, model: str) -> float:
        assert isinstance(client, anthropic.Anthropic)
        client.messages.create(model=model, max_tokens=3, messages=messages(task))
        return float(task["r"])

    both = asyncio.Barrier(2)

    async def own_client(task: dict[str, Any], model: str) -> float:
        await both.wait()  # each builds its client while the other episode is open too
        async with anthropic.AsyncAnthropic(max_retries=0) as client:
            await client.messages.create(model=model, max_tokens=3, messages=messages(task))
        return float(task["r"])

    stats, got = gateway.run(areal.wrap(sync_agent, framework="anthropic_sdk"), tasks[:2])
    assert (stats.finished, stats.failed) == (2, 0), stats.errors
    assert {k: t.reward for k, t in got.items()} == {"t0": 0.0, "t1": 0.25}
    stats, more = gateway.run(areal.wrap(own_client, framework="anthropic_sdk"), tasks[2:])
    assert (stats.finished, stats.failed) == (2, 0), stats.errors
    assert {k: t.reward for k, t in more.items()} == {"t0": 0.0, "t1": 0.25, "t2": 0.5, "t3": 0.75}
    assert all(t.completions == 1 for t in more.values())
