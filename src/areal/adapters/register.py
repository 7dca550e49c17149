"""The built-in adapters, registered through the same hooks as a third-party adapter's.

Each adapter class carries its own name (``framework``) and says whether it is a harness (the
agent itself, :mod:`areal.core.agent_choice`); this module only hands them to the registry, and
the adapter modules are imported when the registry is built, not when plugins load.
"""

from __future__ import annotations

import sys
from typing import Any

from areal.core.hookspecs import Register, hookimpl


@hookimpl
def areal_register_adapters(register: Register) -> None:
    from areal.adapters.anthropic_sdk import AnthropicAdapter
    from areal.adapters.claude_code import ClaudeCodeAdapter
    from areal.adapters.codex import CodexAdapter
    from areal.adapters.dspy import DSPyAdapter
    from areal.adapters.langchain import LangChainAdapter
    from areal.adapters.litellm import LiteLLMAdapter
    from areal.adapters.openai_agents import OpenAIAgentsAdapter
    from areal.adapters.openai_sdk import OpenAIAdapter
    from areal.adapters.openclaw import OpenClawAdapter
    from areal.adapters.pydantic_ai import PydanticAIAdapter
    from areal.adapters.python_fn import PythonAdapter
    from areal.adapters.vercel_ai import VercelAIAdapter

    for adapter in (
        PythonAdapter,
        OpenAIAdapter,
        OpenAIAgentsAdapter,
        AnthropicAdapter,
        LangChainAdapter,
        PydanticAIAdapter,
        DSPyAdapter,
        LiteLLMAdapter,
        VercelAIAdapter,
        ClaudeCodeAdapter,
        OpenClawAdapter,
        CodexAdapter,
    ):
        register(adapter.framework, adapter)


@hookimpl(trylast=True)
def areal_wrap_agent(agent: Any, options: dict[str, Any]) -> Any:
    """The built-in guess, asked last (any plugin that claims the agent first wins): a LangChain
    runnable -> ``langchain``; an ``agents.Agent`` (OpenAI Agents SDK) -> ``openai_agents``; a
    ``pydantic_ai.Agent`` -> ``pydantic_ai``; any other function or object with ``run`` ->
    ``openai_sdk`` (the run config's default framework). Names, adapters and ``agent(episode)`` functions never get
    here: :func:`areal.core.agent_choice.choose_adapter` settles them first."""
    from areal.adapters.langchain import LangChainAdapter
    from areal.adapters.openai_agents import OpenAIAgentsAdapter
    from areal.adapters.openai_sdk import OpenAIAdapter
    from areal.adapters.pydantic_ai import PydanticAIAdapter

    if "langchain_core" in sys.modules and LangChainAdapter.accepts(agent):
        return LangChainAdapter(agent, **options)
    if "agents" in sys.modules and OpenAIAgentsAdapter.accepts(agent):
        return OpenAIAgentsAdapter(agent, **options)
    if "pydantic_ai" in sys.modules and PydanticAIAdapter.accepts(agent):
        return PydanticAIAdapter(agent, **options)
    if callable(agent) or callable(getattr(agent, "run", None)):
        return OpenAIAdapter(agent, **options)
    return None
