"""``areal.wrap`` routing through the ``areal_wrap_agent`` hook, and ``resolve_agent`` turning a
run config's ``agent.framework`` + ``agent.entrypoint`` into the rollout worker's AgentFn."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from langchain_core.prompts import ChatPromptTemplate
from langchain_openai import ChatOpenAI

import areal
from areal.adapters.anthropic_sdk import AnthropicAdapter
from areal.adapters.base import Adapter, AdapterError
from areal.adapters.langchain import LangChainAdapter
from areal.adapters.openai_sdk import OpenAIAdapter
from areal.adapters.python_fn import PythonAdapter
from areal.core.episode import Episode, takes_episode
from areal.core.plugins import make_plugin_manager
from areal.plugins.tasks import calculator
from areal.run.rollout_worker import WorkerSpec, resolve_agent


async def by_task(task: Any, client: Any) -> float:
    return 1.0


def sync_by_task(task: Any, client: Any) -> float:
    return 1.0


class Runner:
    async def run(self, task: Any, **kw: Any) -> float:
        return 1.0


class Harness(Adapter):
    """A stand-in CLI harness adapter, registered by name as claude_code would be."""

    async def agent_fn(self, episode: Episode) -> float:
        return 0.5


class ThirdParty:
    """A plugin that claims every agent whose name starts with ``smol``."""

    @areal.hookimpl
    def areal_wrap_agent(self, agent: Any, options: dict[str, Any]) -> Any:
        if getattr(agent, "__name__", "").startswith("smol"):
            return Harness(agent, **options)
        return None

    @areal.hookimpl
    def areal_register_adapters(self, register: Any) -> None:
        register("echo_harness", Harness)


@pytest.fixture
def pm() -> Any:
    manager = make_plugin_manager(load_entry_points=False)
    manager.register(ThirdParty(), name="third_party")
    return manager


def test_builtin_routing() -> None:
    chain = ChatPromptTemplate.from_messages([("user", "{q}")]) | ChatOpenAI(api_key="x")
    assert isinstance(areal.wrap(by_task), OpenAIAdapter)
    assert isinstance(areal.wrap(sync_by_task), OpenAIAdapter)
    assert isinstance(areal.wrap(Runner()), OpenAIAdapter)
    assert isinstance(areal.wrap(calculator.agent), PythonAdapter)  # agent(episode)
    assert isinstance(areal.wrap(chain), LangChainAdapter)
    assert isinstance(areal.wrap(by_task, framework="anthropic_sdk"), AnthropicAdapter)
    adapter = areal.wrap(by_task)
    assert areal.wrap(adapter) is adapter
    with pytest.raises(AdapterError, match=r"no adapter named 'claude_cod'.*openai_sdk"):
        areal.wrap("claude_cod")
    with pytest.raises(AdapterError, match="no adapter knows how to run 42"):
        areal.wrap(42)
    with pytest.raises(AdapterError, match="takes no task argument"):
        areal.wrap(lambda: 1.0)


def test_a_third_party_hook_wins_and_names_route(pm: Any) -> None:
    async def smol_agent(task: Any, client: Any) -> float:
        return 1.0

    assert isinstance(areal.wrap(smol_agent, plugin_manager=pm), Harness)
    assert isinstance(areal.wrap(by_task, plugin_manager=pm), OpenAIAdapter)  # not claimed
    harness = areal.wrap("echo_harness", plugin_manager=pm, timeout=3)
    assert isinstance(harness, Harness) and harness.options == {"timeout": 3}


def test_takes_episode() -> None:
    def typed(e: Episode) -> None: ...

    assert takes_episode(calculator.agent) and takes_episode(typed)
    assert takes_episode(lambda episode: 1.0)
    assert not takes_episode(by_task) and not takes_episode(lambda task: 1.0)


def spec(tmp_path: Path, **fields: Any) -> WorkerSpec:
    base: dict[str, Any] = {
        "gateway_url": "http://127.0.0.1:1", "agent": None, "dataset": {}, "worker": 0,
        "workers": 1, "group_size": 1, "concurrency": 2, "episode_timeout_s": 30.0,
        "max_turns": 4, "model": "areal-nano", "progress_path": str(tmp_path / "p.json"),
    }  # fmt: skip
    return WorkerSpec(**{**base, **fields})


@pytest.fixture
def agent_module(tmp_path: Path, monkeypatch: Any) -> str:
    (tmp_path / "my_agents.py").write_text(
        textwrap.dedent(
            """
            import areal

            async def solve(task, client, model):
                reply = await client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": task["question"]}],
                    max_tokens=2,
                )
                return 0.75 if reply.choices else 0.0

            def plain(episode):
                return 0.25

            wrapped = areal.wrap(solve, framework="openai_sdk")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_agents"


def test_resolve_agent_wraps_the_entrypoint(
    gateway: Any, tasks: Any, tmp_path: Path, agent_module: str
) -> None:
    fn = resolve_agent(spec(tmp_path, agent=f"{agent_module}:solve", framework="openai_sdk"))
    assert isinstance(fn.__self__, OpenAIAdapter)
    stats, got = gateway.run(fn, tasks[:2])
    assert stats.finished == 2 and [t.reward for t in got.values()] == [0.75, 0.75]

    # no framework: the hook chooses; an areal.wrap result and a plain agent(episode) run as is
    chosen = resolve_agent(spec(tmp_path, agent=f"{agent_module}:solve"))
    assert isinstance(chosen.__self__, OpenAIAdapter)
    wrapped = resolve_agent(spec(tmp_path, agent=f"{agent_module}:wrapped", framework="langchain"))
    assert isinstance(wrapped.__self__, OpenAIAdapter)
    plain = resolve_agent(spec(tmp_path, agent=f"{agent_module}:plain", framework="openai_sdk"))
    assert plain.__name__ == "plain"
    python = resolve_agent(spec(tmp_path, agent=f"{agent_module}:solve", framework="python"))
    assert python.__name__ == "solve"


def test_resolve_agent_task_sets_and_harnesses(tmp_path: Path, pm: Any) -> None:
    calc = {"name": "calculator"}
    assert resolve_agent(spec(tmp_path, dataset=calc, framework="openai_sdk")) is calculator.agent
    assert resolve_agent(spec(tmp_path, dataset=calc)) is calculator.agent
    harness = resolve_agent(spec(tmp_path, dataset=calc, framework="echo_harness"), pm)
    assert isinstance(harness.__self__, Harness) and harness.__self__.agent == "echo_harness"
    with pytest.raises(Exception, match="echo_harnes"):
        resolve_agent(spec(tmp_path, dataset=calc, framework="echo_harnes"), pm)


def test_wrap_stays_light() -> None:
    code = "import sys, areal; areal.wrap(lambda t, c: 1.0); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_agent_config_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "agent_config.py"
    path.write_text('AGENT_CONFIG = {"model_name": "m", "max_turns": 3, "top_p": 0.9}\n')
    adapter = areal.wrap(by_task, agent_config=path)
    ep = Episode(task={}, base_url="http://gw/v1", api_key="sk-session", model="pol", max_turns=5,
                 session_id="s")  # fmt: skip
    config = adapter.extras(ep)["config"]
    assert config == {
        "model_name": "pol", "max_turns": 5, "top_p": 0.9,
        "model_base_url": "http://gw/v1", "api_key": "sk-session",
    }  # fmt: skip
    (tmp_path / "empty.py").write_text("X = 1\n")
    with pytest.raises(AdapterError, match="must define AGENT_CONFIG"):
        areal.wrap(by_task, agent_config=tmp_path / "empty.py")


def test_langchain_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "langchain_openai", None)
    with pytest.raises(AdapterError, match=r"pip install 'areal\[langchain\]'"):
        areal.wrap(by_task, framework="langchain")
