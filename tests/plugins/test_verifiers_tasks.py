"""``verifiers``: environments written with verifiers' own classes run their own rollouts,
unchanged, against a real gateway in front of a real embedded engine; the gateway records every
call, and the reward is the one the environment's rewards give the recorded rollout."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from areal.core.config import ConfigError
from areal.core.tasks import configured, load_object
from areal.core.types import Trajectory
from areal.plugins.inference.embedded.server import InferenceServer
from areal.plugins.tasks import verifiers_env
from areal.run.rollout import RolloutWorker
from support.engines import nano_engine
from support.gateway import RunningGateway, running_gateway, trajectories
from support.runs import make_config

TESTS = Path(__file__).resolve().parents[1]
ENVS = "support.verifiers_envs"


@pytest.fixture(autouse=True)
def tests_on_pythonpath(monkeypatch: pytest.MonkeyPatch) -> None:
    """verifiers starts a tool server as ``python -m support.verifiers_envs``; a run's rollout
    workers import the environment the same way."""
    paths = [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, InferenceServer]]:
    with nano_engine(tmp_path_factory.mktemp("verifiers-model") / "nano") as served:
        yield served


@pytest.fixture
def gateway(engine: tuple[str, InferenceServer], tmp_path: Path) -> Iterator[RunningGateway]:
    """A fresh gateway per test, so its trajectories file holds that test's episodes only."""
    with running_gateway(*engine, tmp_path) as gw:
        yield gw


def play(gateway: RunningGateway, environment: str, n: int) -> tuple[dict[str, Any], Any]:
    """Tasks 0..n-1 of ``environment``'s task set through a real rollout worker; the verifiers
    episodes by task id, and the trajectories the gateway recorded, by task id."""
    found = configured(verifiers_env.TASK_SET, {"environment": environment})
    episodes: dict[str, Any] = {}

    async def agent(episode: Any) -> float:
        # The task set's own agent, keeping verifiers' record of the episode to check against.
        result = await verifiers_env.run_row(episode)
        episodes[episode.task["task_id"]] = result
        return verifiers_env.reward_of(result)

    tasks = [found.task(i, 0) for i in range(n)]
    worker = RolloutWorker(
        gateway.url, gateway.admin, agent, concurrency=n, model=gateway.model, episode_timeout_s=120
    )
    stats = asyncio.run(worker.run(tasks))
    assert (stats.finished, stats.failed) == (n, 0), stats.errors
    recorded = {t.metadata["task_id"]: t for t in trajectories(gateway.log_dir)}
    return episodes, recorded


def rescored(environment: str, result: Any) -> float:
    """What the environment's rewards give the same finished rollout, scored afresh."""
    env = verifiers_env.environment({"environment": environment, "config": {}})
    (trace,) = result.traces
    fresh = trace.model_copy(update={"rewards": {}, "metrics": {}})
    row = next(t for t in env.taskset if t.data.idx == trace.task.data.idx)
    asyncio.run(row.score(fresh))
    return float(fresh.reward)


def check_recorded(recorded: Trajectory, result: Any, calls: int) -> None:
    """The gateway holds every model call of the rollout, token by token."""
    (trace,) = result.traces
    assert len(trace.calls) == recorded.completions == len(recorded.turns) == calls
    for turn in recorded.turns:
        assert turn.output_ids and len(turn.output_logprobs) == len(turn.output_ids)
        assert all(lp <= 0.0 for lp in turn.output_logprobs)
    assert [len(t.output_ids) for t in recorded.turns] == [
        c.usage.completion_tokens for c in trace.calls
    ]


@pytest.mark.parametrize(
    ("name", "calls"), [("single_turn", 1), ("multi_turn", 2), ("with_tool", 1)]
)
def test_an_environment_runs_its_own_rollout_through_the_gateway(
    gateway: RunningGateway, name: str, calls: int
) -> None:
    environment = f"{ENVS}:{name}"
    episodes, recorded = play(gateway, environment, 2)
    assert set(episodes) == set(recorded) == {"verifiers-0-0", "verifiers-0-1"}
    for task_id, result in episodes.items():
        assert result.ok, result.errors
        check_recorded(recorded[task_id], result, calls)
        # The reward the trainer gets is verifiers' own, for the rollout the gateway recorded.
        (trace,) = result.traces
        assert recorded[task_id].reward == pytest.approx(trace.reward)
        assert recorded[task_id].reward == pytest.approx(rescored(environment, result))
        assert trace.reward > 0.0  # the reply-length credit: the rewards ran on real replies
    if name == "with_tool":  # the task's tool server was up and offered its tool
        assert all(
            [tool.name for tool in result.traces[0].tools] == ["add"]
            for result in episodes.values()
        )


def test_tasks_are_the_rows_in_a_seeded_order_each_pass() -> None:
    found = configured(verifiers_env.TASK_SET, {"environment": f"{ENVS}:single_turn"})
    first = [found.task(i, 0)["row"] for i in range(6)]
    assert sorted(first[:3]) == sorted(first[3:]) == [0, 1, 2]  # each pass visits every row
    assert [found.task(i, 0) for i in range(6)] == [found.task(i, 0) for i in range(6)]
    assert found.task(0, 0)["question"] == "What is {} plus {}?".format(
        *{0: (2, 3), 1: (4, 4), 2: (1, 6)}[first[0]]
    )
    plain = configured(
        verifiers_env.TASK_SET, {"environment": f"{ENVS}:single_turn", "shuffle": False}
    )
    assert [plain.task(i, 7)["row"] for i in range(4)] == [0, 1, 2, 0]
    assert load_object(found.agent) is verifiers_env.agent


def test_a_taskset_id_is_built_with_its_config() -> None:
    """An id, as ``vf-eval`` takes it: the taskset's module, with EnvConfig fields."""
    config = {"agent": {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}}
    options = {"environment": "areal_verifiers_demo", "config": config}
    load_object(f"{ENVS}:single_turn")  # the module answers to its taskset id once imported
    found = configured(verifiers_env.TASK_SET, options)
    assert found.task(0, 0)["verifiers"] == {
        "environment": "areal_verifiers_demo",
        "config": config,
    }
    env = verifiers_env.environment(found.task(0, 0)["verifiers"])
    assert type(env).__name__ == "SingleAgentEnv" and env.config.agent.harness.id == "null"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "dataset.options.environment: the verifiers task set needs an environment"),
        ({"environment": ""}, "dataset.options.environment: name the environment"),
        ({"environment": "x:y", "stuff": 1}, "dataset.options.stuff: the verifiers task set"),
        ({"environment": f"{ENVS}:QUESTIONS"}, "is list, not a vf.Env"),
        ({"environment": "no_such_env_xyz"}, "no verifiers taskset 'no_such_env_xyz'"),
        ({"environment": f"{ENVS}:single_turn", "config": {"a": 1}}, "dataset.options.config"),
        ({"environment": f"{ENVS}:single_turn", "shuffle": "yes"}, "dataset.options.shuffle"),
        (
            {"environment": f"{ENVS}:single_turn", "success_reward": "1"},
            "dataset.options.success_reward",
        ),
    ],
)
def test_bad_options_name_the_key_and_the_fix(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("?", r"\?")):
        found = configured(verifiers_env.TASK_SET, options)
        found.task(0, 0)


@pytest.mark.serial
def test_areal_train_runs_two_steps_on_a_verifiers_environment(tmp_path: Path) -> None:
    from areal.run.runner import train

    config = make_config(
        tmp_path,
        dataset={"name": "verifiers", "options": {"environment": f"{ENVS}:single_turn"}},
        train={"max_steps": 2},
    )
    summary = train(config, tmp_path / "out")
    assert summary.steps == 2 and summary.stopped_by == "max_steps"
    assert summary.counters["trained"] == 2 * 4
