"""The runnable examples under ``examples/``: each config validates and names an agent that loads;
each in-process agent and Claude Code run one probed episode through the real gateway and nano
engine; the bug-fix tasks are solvable (their test passes once the bug is fixed, fails before);
and one example trains end to end with ``areal train`` under a non-default framework (that run
and Claude Code's are in the serial tier)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from areal.core.rewards import build_reward
from areal.core.run_config import load_run_config
from areal.run.probe import probe
from areal.run.rollout_worker import WorkerSpec, resolve_agent
from support.cli import CLAUDE_CODE, CODEX, vercel_ai_sdk

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
IN_PROCESS = [
    "openai_math",
    "langchain_tools",
    "openai_agents_math",
    "pydantic_ai_math",
    "dspy_math",
    "litellm_math",
]
NAMES = [*IN_PROCESS, "vercel_ai_math", "claude_code_fix", "openclaw_task", "codex_fix"]


@pytest.fixture(autouse=True)
def repo_on_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Entrypoints are ``examples.<name>.agent:...``: importable from the repository root."""
    monkeypatch.syspath_prepend(str(REPO))
    monkeypatch.chdir(REPO)
    yield


def tasks(name: str) -> list[dict[str, Any]]:
    lines = (EXAMPLES / name / "tasks.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def agent_of(name: str) -> Any:
    config = load_run_config(EXAMPLES / name / "config.yaml")
    spec = WorkerSpec(
        gateway_url="http://127.0.0.1:9", agent=config.agent.entrypoint,
        framework=config.agent.framework, dataset=config.dataset.model_dump(), worker=0,
        workers=1, group_size=1, concurrency=1, episode_timeout_s=60, max_turns=4,
        model="m", progress_path="-",
    )  # fmt: skip
    return config, resolve_agent(spec)


@pytest.mark.parametrize("name", NAMES)
def test_each_example_config_validates_and_its_agent_loads(name: str) -> None:
    config, agent = agent_of(name)
    assert callable(agent)
    assert config.dataset.path == f"examples/{name}/tasks.jsonl" and tasks(name)
    assert (EXAMPLES / name / "agent.py").is_file()
    readme = (EXAMPLES / "README.md").read_text()
    assert f"examples/{name}/config.yaml" in readme


@pytest.mark.parametrize("name", ["claude_code_fix", "openclaw_task", "codex_fix"])
def test_the_bug_fix_tasks_are_solvable(name: str, tmp_path: Path) -> None:
    fixes = {"add": "a + b", "mul": "a * b", "sub": "a - b", "half": "a // 2"}
    for task in tasks(name):
        work = tmp_path / task["task_id"]
        work.mkdir()
        for file, text in task["files"].items():
            (work / file).write_text(text)
        run = [sys.executable, "test_calc.py"]
        assert subprocess.run(run, cwd=work, capture_output=True).returncode != 0  # the bug
        fn = task["task_id"].rsplit("-", 1)[-1]
        body = (work / "calc.py").read_text().splitlines()[0]
        (work / "calc.py").write_text(f"{body}\n    return {fixes[fn]}\n")
        assert subprocess.run(run, cwd=work, capture_output=True).returncode == 0


@pytest.mark.parametrize(
    "name",
    [
        *IN_PROCESS,
        pytest.param("vercel_ai_math", marks=pytest.mark.serial),
        pytest.param("claude_code_fix", marks=pytest.mark.serial),
        pytest.param("codex_fix", marks=pytest.mark.serial),
    ],
)
def test_each_example_agent_runs_one_probed_episode(name: str, gateway: Any) -> None:
    if name == "claude_code_fix":
        CLAUDE_CODE()  # the example runs the CLI that `make setup` installs
    if name == "codex_fix":
        CODEX()
    if name == "vercel_ai_math":
        vercel_ai_sdk()  # its agent is a Node script on the AI SDK that `make setup` installs
    config, agent = agent_of(name)
    reward = config.agent.reward_source
    report = asyncio.run(
        probe(
            agent,
            gateway_url=gateway.url,
            admin_token=gateway.admin,
            task=tasks(name)[0],
            model=gateway.model,
            reward_fn=None if reward == "agent" else build_reward(reward, {}),
            timeout_s=120,
        )
    )
    assert report.outcome == "finished", report.to_json()
    assert report.calls and all(c["status"] == 200 for c in report.calls)
    # The untrained nano policy gets nothing right: the reward is a real 0.0 (scored, not missing).
    assert report.reward == 0.0


@pytest.mark.serial
def test_an_example_trains_with_areal_train(tmp_path: Path) -> None:
    """The LangChain example, two steps on the nano model, as a user would start it."""
    areal = Path(sys.executable).parent / "areal"
    sets = {
        "model.init_tiny": "nano",
        "model.path": str(tmp_path / "model"),
        "logging.log_dir": str(tmp_path / "logs"),
        "train.max_steps": "2",
        "train.global_batch_size": "4",
        "train.mini_batch_size": "4",
        "async.trigger_batch_size": "4",
        "algorithm.group_size": "2",
        "sampling.max_new_tokens": "16",
    }
    cmd = [str(areal), "train", "examples/langchain_tools/config.yaml", "-o", str(tmp_path / "out")]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    log = (tmp_path / "logs" / "train.log").read_text().splitlines()
    assert sum(line.startswith("[train] step=") for line in log) == 2
    audit = (tmp_path / "out" / "run" / "trained.jsonl").read_text().splitlines()
    assert len(audit) >= 8 and all(json.loads(r)["task_index"] >= 0 for r in audit)
