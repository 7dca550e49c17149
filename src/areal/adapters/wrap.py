"""``areal.wrap(agent)``: find the adapter for an agent, through the plugins.

With ``framework=`` the adapter registered under that name wraps the agent; otherwise the
``areal_wrap_agent`` hook (firstresult) chooses, so a third-party plugin's answer wins over the
built-in guess, which comes last (:func:`builtin_choice`).
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import pluggy

from areal.adapters.anthropic_sdk import AnthropicAdapter
from areal.adapters.base import Adapter, AdapterError
from areal.adapters.claude_code import ClaudeCodeAdapter
from areal.adapters.langchain import LangChainAdapter
from areal.adapters.openai_sdk import OpenAIAdapter
from areal.adapters.openclaw import OpenClawAdapter
from areal.adapters.python_fn import PythonAdapter
from areal.core.episode import takes_episode
from areal.core.plugins import get_plugin_manager, registry

BUILTIN: dict[str, type[Adapter]] = {
    "python": PythonAdapter,
    "openai_sdk": OpenAIAdapter,
    "anthropic_sdk": AnthropicAdapter,
    "langchain": LangChainAdapter,
    "claude_code": ClaudeCodeAdapter,
    "openclaw": OpenClawAdapter,
}


def wrap(
    agent: Any,
    *,
    framework: str | None = None,
    plugin_manager: pluggy.PluginManager | None = None,
    **options: Any,
) -> Any:
    """The adapter for ``agent``: something with ``agent_fn(episode)`` for the rollout worker."""
    pm = plugin_manager or get_plugin_manager()
    if framework is None and isinstance(agent, str):
        framework = agent  # a harness by name ("claude_code"): its adapter or a clear error
    if framework is not None:
        adapters = registry("adapters", pm)
        if framework not in adapters:
            raise AdapterError(
                f"no adapter named {framework!r} is registered; registered: "
                f"{', '.join(adapters.names())} (is the plugin that provides it installed?)"
            )
        return adapters.get(framework)(agent, **options)
    adapter = pm.hook.areal_wrap_agent(agent=agent, options=options)
    if adapter is None:
        raise AdapterError(
            f"no adapter knows how to run {agent!r}; pass framework= (one of "
            f"{', '.join(registry('adapters', pm).names())})"
        )
    return adapter


def builtin_choice(
    agent: Any, options: dict[str, Any], pm: pluggy.PluginManager | None = None
) -> Any:
    """The built-in guess: a harness name -> its adapter; an adapter -> itself; ``agent(episode)``
    -> ``python``; a LangChain runnable -> ``langchain``; any other function or object with
    ``run`` -> ``openai_sdk`` (the run config's default framework)."""
    if isinstance(agent, str):
        adapters = registry("adapters", pm or get_plugin_manager())
        if agent not in adapters:
            raise AdapterError(
                f"no adapter named {agent!r} is registered; registered: "
                f"{', '.join(adapters.names())}"
            )
        return adapters.get(agent)(agent, **options)
    if callable(getattr(agent, "agent_fn", None)) and not inspect.isclass(agent):
        return agent
    if "langchain_core" in sys.modules and LangChainAdapter.accepts(agent):
        return LangChainAdapter(agent, **options)
    if callable(agent) and takes_episode(agent):
        return PythonAdapter(agent, **options)
    if callable(agent) or callable(getattr(agent, "run", None)):
        return OpenAIAdapter(agent, **options)
    return None
