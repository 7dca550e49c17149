"""Rollout workers against a real gateway and engine: an openai-SDK agent over tasks × samples lands
in the JSONL sink with task ids, groups and rewards; crashes and timeouts are counted without
blocking the rest, but an agent that never finishes an episode stops the worker; a full staleness budget is waited out (or given up on, with a clear error)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import openai
import pytest

from areal.core.episode import Episode
from areal.core.staleness import StalenessBudget
from areal.core.types import Trajectory
from areal.plugins.rewards.rules import exact_match
from areal.run.rollout import GIVE_UP_AFTER, AgentBroken, RolloutError, RolloutWorker
from support import eventually_async
from support.gateway import POLICY, trajectories

LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {"key": {"type": "string", "enum": ["a", "b"]}},
            "required": ["key"],
        },
    },
}
TASKS = [{"task_id": f"t{i}", "prompt": f"Question {i}?", "answer": "yes"} for i in range(3)]


async def tool_agent(episode: Episode) -> str:
    """Two policy calls: a forced tool call, then an answer after the tool's result."""
    client = episode.openai_client()
    messages: list[Any] = [{"role": "user", "content": episode.task["prompt"]}]
    first = await client.chat.completions.create(
        model=episode.model,
        messages=messages,
        tools=[LOOKUP],
        tool_choice={"type": "function", "function": {"name": "lookup"}},
        max_tokens=64,
        seed=episode.sample + 1,
    )
    call = (first.choices[0].message.tool_calls or [])[0]
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "yes"},
    ]
    second = await client.chat.completions.create(
        model=episode.model, messages=messages, max_tokens=4
    )
    await client.close()
    # The tiny model's own text is noise; answer "yes" on even samples so rewards are known.
    return "yes" if episode.sample == 0 else (second.choices[0].message.content or "") + " no"


def worker(gw: Any, agent: Any, **options: Any) -> RolloutWorker:
    return RolloutWorker(gw.url, gw.admin, agent, model=gw.model, **options)


def test_tool_agent_tasks_times_samples_reach_the_sink(start_gateway: Any) -> None:
    with start_gateway(sink="jsonl") as gw:
        rollout = worker(gw, tool_agent, reward_fn=exact_match, concurrency=4)
        stats = asyncio.run(rollout.run(TASKS, n_samples_per_task=2))
        assert (stats.started, stats.finished, stats.sent) == (6, 6, 6)
        assert (stats.failed, stats.timed_out) == (0, 0)
        assert sorted(stats.rewards) == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
        assert stats.mean_reward == 0.5
        got = trajectories(gw.log_dir)
    assert len(got) == 6
    groups: dict[str, list[Trajectory]] = {}
    for t in got:
        assert t.completions == 2  # the tool call and the answer
        assert t.reward == (1.0 if t.metadata["sample"] == 0 else 0.0)
        assert all(s.reward == t.reward for s in t.samples)
        groups.setdefault(t.metadata["group"], []).append(t)
    assert len(groups) == 3
    for members in groups.values():
        assert {t.metadata["task_id"] for t in members} == {members[0].metadata["task_id"]}
        assert sorted(t.metadata["sample"] for t in members) == [0, 1]
    assert {t.metadata["task_id"] for t in got} == {"t0", "t1", "t2"}


def test_an_agent_rewards_its_own_turn_and_a_refused_reward_fails_the_episode(
    start_gateway: Any,
) -> None:
    """``episode.post_reward`` with the session's key: the turn's reward is in its return (turn
    reward 0.25 + episode reward 1); one naming a completion of no call of the session is
    refused, and the episode is discarded, not trained on without it."""

    async def agent(episode: Episode) -> float:
        client = episode.openai_client()
        reply = await client.chat.completions.create(
            model=episode.model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
        await client.close()
        completion = reply.id if episode.sample == 0 else "cmpl-of-another-session"
        await episode.post_reward(0.25, completion_id=completion)
        return 1.0

    with start_gateway(sink="jsonl") as gw:
        stats = asyncio.run(worker(gw, agent).run(TASKS[:1], n_samples_per_task=2))
        assert (stats.finished, stats.failed, stats.sent) == (1, 1, 1)
        assert dict(stats.errors) == {"RuntimeError": 1}
        (got,) = [t for t in trajectories(gw.log_dir) if not t.is_tombstone]
    assert got.metadata["sample"] == 0
    assert [c.reward for c in got.turns] == [0.25]
    assert (got.reward, got.samples[0].turns[0].ret) == (1.0, 1.25)


def test_crashes_and_timeouts_are_counted_and_do_not_block(start_gateway: Any) -> None:
    async def agent(episode: Episode) -> float | None:
        kind = episode.task["kind"]
        if kind == "crash":
            raise ValueError("the agent broke")
        if kind == "hang":
            await asyncio.Event().wait()  # never set: only the episode timeout ends it
        if kind == "none":
            return None
        return 0.25

    tasks = [{"kind": k} for k in ("hang", "crash", "ok", "none", "ok")]
    with start_gateway() as gw:
        rollout = worker(gw, agent, concurrency=2, episode_timeout_s=0.5)
        stats = asyncio.run(rollout.run(tasks))  # it ends, though one agent never does
        assert (stats.started, stats.finished, stats.failed, stats.timed_out) == (5, 3, 1, 1)
        assert stats.sent == 0  # no policy calls: nothing to train on
        assert stats.rewards == [0.25, 0.25]
        assert dict(stats.errors) == {"ValueError": 1, "TimeoutError": 1}
        listing = gw.state.sessions.budget.snapshot()
        assert listing.running == 0  # every slot came back, discarded ones too


def test_an_agent_that_never_works_stops_the_worker_with_its_error(start_gateway: Any) -> None:
    async def agent(episode: Episode) -> float:
        import areal_no_such_module  # type: ignore[import-not-found]  # noqa: F401

        return 1.0

    def endless() -> Any:
        i = 0
        while True:
            yield {"task_id": f"t{i}"}
            i += 1

    with start_gateway() as gw:
        rollout = worker(gw, agent, concurrency=4)
        with pytest.raises(AgentBroken, match="areal_no_such_module") as caught:
            asyncio.run(rollout.run(endless()))
        # The count is the failures when the worker stopped: the 32nd, plus any of the other
        # 3 episodes in flight that failed while it was ending its session.
        failed = re.search(r"all of its first (\d+) episodes", str(caught.value))
        assert failed is not None, caught.value
        assert GIVE_UP_AFTER <= int(failed.group(1)) < GIVE_UP_AFTER + 4
        assert f"'ModuleNotFoundError': {failed.group(1)}" in str(caught.value)
        assert isinstance(caught.value, RolloutError)  # the worker process exits 1 on it
        stats = rollout.last_stats
        assert stats is not None and stats.finished == 0 and stats.broken >= GIVE_UP_AFTER
        # (A session opened at the moment of the stop may stay open: the worker process exits
        # on AgentBroken, and the run discards a dead worker's sessions.)


def test_an_agent_that_worked_once_only_counts_its_failures(start_gateway: Any) -> None:
    async def agent(episode: Episode) -> float:
        if episode.task["task_id"] != "t0":
            raise ValueError("a flaky tool")
        return 1.0

    tasks = [{"task_id": f"t{i}"} for i in range(GIVE_UP_AFTER + 4)]
    with start_gateway() as gw:
        stats = asyncio.run(worker(gw, agent, concurrency=1).run(tasks))
    assert (stats.finished, stats.failed) == (1, GIVE_UP_AFTER + 3)


def test_the_gateway_failing_is_not_a_broken_agent(start_gateway: Any) -> None:
    """An engine restarting fails every episode for a while: API errors never stop the worker."""
    import httpx
    import openai

    async def agent(episode: Episode) -> float:
        raise openai.APIConnectionError(request=httpx.Request("POST", "http://127.0.0.1:9/v1"))

    tasks = [{"task_id": f"t{i}"} for i in range(GIVE_UP_AFTER + 4)]
    with start_gateway() as gw:
        stats = asyncio.run(worker(gw, agent, concurrency=4).run(tasks))
    assert (stats.finished, stats.failed, stats.broken) == (0, GIVE_UP_AFTER + 4, 0)


def test_an_answer_without_reward_fn_fails_the_episode(gateway: Any) -> None:
    stats = asyncio.run(worker(gateway, lambda episode: "yes").run([{"answer": "yes"}]))
    assert (stats.failed, dict(stats.errors)) == (1, {"TypeError": 1})


def test_a_full_budget_is_waited_out(start_gateway: Any) -> None:
    """The first episode holds the only slot until the gateway holds the second one's long
    poll; the second starts as the first ends, not after waiting out the 30 s Retry-After."""
    budget = StalenessBudget(max_concurrent=1, retry_after_s=30)
    first: list[Episode] = []

    async def agent(episode: Episode) -> float:
        if not first:
            first.append(episode)
            await eventually_async(
                lambda: gw.state.sessions.waiting == 1, 60, "the second episode's long poll"
            )
        return 1.0

    with start_gateway(budget=budget) as gw:
        stats = asyncio.run(worker(gw, agent, concurrency=2, max_wait_s=60).run([{}, {}]))
        assert (stats.started, stats.finished) == (2, 2)
        assert 0 < stats.waited_s < 30  # it waited, and not for the Retry-After
        assert budget.snapshot().rejected == 2  # both empty episodes were dropped, not sent


def test_a_budget_that_stays_full_stops_the_run(start_gateway: Any) -> None:
    budget = StalenessBudget(trigger_batch_size=1, staleness_threshold=0)
    assert budget.try_start()  # an episode that never ends holds the only slot

    with start_gateway(budget=budget) as gw:
        rollout = worker(gw, lambda episode: 1.0, max_wait_s=1.5)
        with pytest.raises(RolloutError, match="staleness budget stayed full"):
            asyncio.run(rollout.run([{}]))


def test_episodes_the_gateway_ended_first_are_cut_not_failed(start_gateway: Any) -> None:
    """The trainer trained a group without some members and had the gateway end their sessions
    (``POST /rl/sessions/discard``): one was generating (its call is cut, the agent raises), one
    had made its calls and then ended with its reward (the end answers ``409 session_ended``).
    Both count as ``cut``; neither is a failure, and the worker goes on."""

    async def discard_own_group(gw: Any, episode: Episode) -> None:
        async with httpx.AsyncClient() as http:
            resp = await http.post(
                f"{gw.url}/rl/sessions/discard",
                json={"metadata": {"group": episode.group}},
                headers=gw.headers(gw.admin),
            )
            assert resp.json()["discarded"] == 1

    async def agent(episode: Episode) -> float:
        client = episode.openai_client()
        messages = [{"role": "user", "content": "count"}]
        kind = episode.task["kind"]
        if kind == "mid-call":

            async def cut_while_generating() -> None:
                await eventually_async(
                    lambda: gw.engine_stats()["running"] == 1, 60, "the long call generating"
                )
                await discard_own_group(gw, episode)

            cutter = asyncio.create_task(cut_while_generating())
            try:
                await client.chat.completions.create(
                    model=episode.model,
                    messages=messages,
                    max_tokens=3000,
                    extra_body={"ignore_eos": True},
                )
            except openai.ConflictError:
                outcomes.append("cut mid-call")
                raise
            finally:
                await cutter
        else:
            await client.chat.completions.create(
                model=episode.model, messages=messages, max_tokens=4
            )
            if kind == "after-calls":
                await discard_own_group(gw, episode)
        return 1.0

    outcomes: list[str] = []
    tasks = [{"kind": k} for k in ("mid-call", "after-calls", "ok")]
    routing = {"model_routing": {"policy_model": {"model_id": POLICY, "max_tokens": 3000}}}
    with start_gateway(config=routing, sink="jsonl") as gw:
        stats = asyncio.run(worker(gw, agent, concurrency=1).run(tasks))
        assert outcomes == ["cut mid-call"]
        assert (stats.started, stats.finished, stats.cut, stats.failed) == (3, 1, 2, 0)
        assert stats.sent == 1 and not stats.errors
        assert stats.to_json()["cut"] == 2
        assert gw.state.sessions.budget.snapshot().running == 0
        assert [t.metadata["task_id"] for t in trajectories(gw.log_dir)] == [2]
