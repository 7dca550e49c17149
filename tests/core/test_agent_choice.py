"""The one choice of adapter (``areal.core.agent_choice``), shared by ``areal.wrap`` and the
rollout worker: what passes through, what the registry gives, what the hook decides, and the
properties adapters declare instead of a list of names."""

from __future__ import annotations

from typing import Any

import pytest

from areal import hookimpl
from areal.core.agent_choice import (
    AdapterError,
    agent_fn_of,
    choose_adapter,
    is_adapter,
    is_harness,
)
from areal.core.plugins import make_plugin_manager


class Boxed:
    """A third-party adapter that wraps user code: a plain class, no ``harness`` attribute."""

    def __init__(self, agent: Any, **options: Any) -> None:
        self.agent, self.options = agent, options

    async def agent_fn(self, episode: Any) -> float:
        return 1.0


class Cli(Boxed):
    harness = True


class Unchanged(Boxed):
    runs_unchanged = True


class Claimable:
    """An agent only the plugin's hook knows."""


class Plugin:
    @hookimpl
    def areal_register_adapters(self, register: Any) -> None:
        register("boxed", Boxed)
        register("cli", Cli)
        register("unchanged", Unchanged)

    @hookimpl
    def areal_wrap_agent(self, agent: Any, options: dict[str, Any]) -> Any:
        return Boxed(agent, claimed=True, **options) if isinstance(agent, Claimable) else None


@pytest.fixture
def pm() -> Any:
    manager = make_plugin_manager(load_entry_points=False)
    manager.register(Plugin(), name="plugin")
    return manager


def by_task(task: Any, client: Any) -> float:
    return 1.0


def plain(episode: Any) -> float:
    return 0.5


def test_adapters_and_plain_agents_pass_through(pm: Any) -> None:
    adapter = Boxed(by_task)
    assert choose_adapter(adapter, framework="cli", pm=pm) is adapter
    assert choose_adapter(plain, framework="boxed", pm=pm) is plain
    assert agent_fn_of(adapter).__self__ is adapter and agent_fn_of(plain) is plain
    assert is_adapter(adapter) and not is_adapter(Boxed) and not is_adapter(plain)


def test_a_framework_is_the_registered_adapter(pm: Any) -> None:
    chosen = choose_adapter(by_task, framework="boxed", options={"timeout": 3}, pm=pm)
    assert isinstance(chosen, Boxed) and chosen.options == {"timeout": 3}
    harness = choose_adapter("cli", pm=pm)  # a name alone is a harness by name
    assert isinstance(harness, Cli) and harness.agent == "cli"
    assert choose_adapter(by_task, framework="unchanged", pm=pm) is by_task


def test_without_a_framework_the_hook_chooses(pm: Any) -> None:
    claimed = choose_adapter(Claimable(), options={"x": 1}, pm=pm)
    assert isinstance(claimed, Boxed) and claimed.options == {"claimed": True, "x": 1}
    assert type(choose_adapter(by_task, pm=pm)).__name__ == "OpenAIAdapter"  # the built-in guess
    with pytest.raises(AdapterError, match=r"^no adapter knows how to run 42; set agent.framework"):
        choose_adapter(42, pm=pm, key="agent.framework")


def test_unknown_framework_names_the_key_and_the_adapters(pm: Any) -> None:
    with pytest.raises(AdapterError) as err:
        choose_adapter(by_task, framework="nope", pm=pm, key="agent.framework")
    message = str(err.value)
    assert message.startswith("agent.framework: no adapter named 'nope' is registered; ")
    assert "boxed" in message and "openai_sdk" in message
    assert isinstance(err.value, ValueError) and isinstance(err.value, TypeError)


def test_harness_is_declared_by_the_adapter(pm: Any) -> None:
    assert is_harness("cli", pm) and not is_harness("boxed", pm)
    assert is_harness("claude_code", pm) and is_harness("openclaw", pm)
    for library in ("python", "openai_sdk", "anthropic_sdk", "langchain"):
        assert not is_harness(library, pm), library
