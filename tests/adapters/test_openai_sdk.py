"""``openai_sdk``: agents written against the real ``openai`` SDK, run through a real rollout
worker, gateway and engine; each episode's calls land in its own session with its reward."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import openai
import pytest

import areal
from areal.adapters.openai_sdk import OpenAIAdapter

SEED_CONFIG = {
    "model_base_url": "http://localhost:9000/gateway/v1",
    "model_name": "my-model",
    "api_key": "sk-not-this-one",
    "max_turns": 6,
    "temperature": 0.3,
}


def ask(client: Any, model: str, task: dict[str, Any]) -> Any:
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": task["question"]}], max_tokens=3
    )


def test_async_agent_gets_a_bound_client_and_the_seed_config(gateway: Any, tasks: Any) -> None:
    seen: list[dict[str, Any]] = []

    async def agent(task: dict[str, Any], client: Any, config: dict[str, Any]) -> float:
        assert isinstance(client, openai.AsyncOpenAI) and client.max_retries == 0
        await ask(client, config["model_name"], task)
        seen.append(config)
        return float(task["r"])

    adapter = areal.wrap(agent, agent_config=SEED_CONFIG)
    assert isinstance(adapter, OpenAIAdapter)
    stats, got = gateway.run(adapter, tasks)
    assert (stats.finished, stats.sent, stats.failed) == (4, 4, 0)
    assert {k: t.reward for k, t in got.items()} == {"t0": 0.0, "t1": 0.25, "t2": 0.5, "t3": 0.75}
    assert all(t.completions == 1 for t in got.values())
    for config in seen:  # URL, key and model overridden per episode; the rest kept
        assert config["model_base_url"] == gateway.url + "/v1"
        assert config["model_name"] == gateway.model and config["max_turns"] == 8
        assert config["api_key"] not in (SEED_CONFIG["api_key"], gateway.admin)
        assert config["temperature"] == 0.3
    assert len({c["api_key"] for c in seen}) == 4  # one session key per episode


def test_sync_agent_answers_and_the_reward_fn_scores(gateway: Any, tasks: Any) -> None:
    def agent(task: dict[str, Any], client: Any, model: str) -> str:
        assert isinstance(client, openai.OpenAI)
        ask(client, model, task)
        return task["answer"] if task["r"] >= 0.5 else "no idea"

    def exact(completion: str, task: Any) -> float:
        return 1.0 if completion == task["answer"] else 0.0

    stats, got = gateway.run(areal.wrap(agent, framework="openai_sdk"), tasks, reward_fn=exact)
    assert stats.finished == 4
    assert {k: t.reward for k, t in got.items()} == {"t0": 0.0, "t1": 0.0, "t2": 1.0, "t3": 1.0}


def test_own_clients_from_env_see_their_own_episode(gateway: Any, tasks: Any) -> None:
    """Four concurrent episodes build clients from OPENAI_* (two of them in threads): each sees its
    own key, so every session records exactly its own call."""
    before = os.environ.get("OPENAI_API_KEY")
    built = {i: asyncio.Event() for i in range(4)}

    async def agent(task: dict[str, Any], episode: Any) -> float:
        # Interleaved: all four are open, and each builds its client (t3 first) while the calls
        # of those built before are still on their way.
        i = int(task["task_id"][1])
        if i < 3:
            await built[i + 1].wait()
        if task["r"] >= 0.5:
            client = await asyncio.to_thread(openai.OpenAI, max_retries=0)
            built[i].set()
            await asyncio.to_thread(ask, client, episode.model, task)
        else:
            client = openai.AsyncOpenAI(max_retries=0)
            built[i].set()
            await ask(client, episode.model, task)
        assert client.api_key == episode.api_key == os.getenv("OPENAI_API_KEY")
        assert str(client.base_url).rstrip("/") == episode.base_url
        return float(task["r"])

    stats, got = gateway.run(areal.wrap(agent), tasks)
    assert (stats.finished, stats.failed) == (4, 0), stats.errors
    assert sorted(t.completions for t in got.values()) == [1, 1, 1, 1]
    assert {k: t.reward for k, t in got.items()} == {"t0": 0.0, "t1": 0.25, "t2": 0.5, "t3": 0.75}
    assert os.environ.get("OPENAI_API_KEY") == before  # nothing leaked out of the episodes


def test_object_with_async_run(gateway: Any, tasks: Any) -> None:
    class Agent:
        async def run(self, task: dict[str, Any], **kw: Any) -> float:
            reply = await ask(kw["client"], kw["model"], task)
            return 1.0 if reply.choices[0].message.content is not None else 0.0

    stats, got = gateway.run(areal.wrap(Agent()), tasks[:2])
    assert stats.finished == 2 and [t.reward for t in got.values()] == [1.0, 1.0]


@pytest.mark.parametrize(
    ("out", "error"), [(ValueError("boom"), "ValueError"), ([1.0], "TypeError")]
)
def test_a_crash_or_garbage_fails_the_episode(
    gateway: Any, tasks: Any, out: Any, error: str
) -> None:
    async def agent(task: dict[str, Any], client: Any, model: str) -> Any:
        await ask(client, model, task)
        if isinstance(out, Exception):
            raise out
        return out

    stats, got = gateway.run(areal.wrap(agent), tasks[:2])
    assert (stats.finished, stats.failed, stats.rewards) == (0, 2, [])
    assert dict(stats.errors) == {error: 2}
    assert got == {}  # discarded: no zero reward reaches the trainer
