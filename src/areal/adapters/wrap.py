"""``areal.wrap(agent)``: the adapter for an agent, chosen through the plugins.

The choice is :func:`areal.core.agent_choice.choose_adapter`, the same one the rollout worker
makes for a run's ``agent.framework``: with ``framework=`` the adapter registered under that name
wraps the agent; otherwise the ``areal_wrap_agent`` hook (firstresult) chooses, so a third-party
plugin's answer wins over the built-in guess, which comes last (:mod:`areal.adapters.register`).
"""

from __future__ import annotations

from typing import Any

import pluggy

from areal.adapters.python_fn import PythonAdapter
from areal.core.agent_choice import choose_adapter, is_adapter


def wrap(
    agent: Any,
    *,
    framework: str | None = None,
    plugin_manager: pluggy.PluginManager | None = None,
    **options: Any,
) -> Any:
    """The adapter for ``agent``: something with ``agent_fn(episode)`` for the rollout worker.

    A plain ``agent(episode)``, which needs no adapter, comes back as the ``python`` adapter, so
    the result always has ``agent_fn``.
    """
    chosen = choose_adapter(agent, framework=framework, options=options, pm=plugin_manager)
    return chosen if is_adapter(chosen) else PythonAdapter(chosen, **options)
