"""Which adapter runs an agent: decided here, once, for ``areal.wrap`` and for the rollout worker.

Adapters are reached through the plugin registry only (core never imports ``areal.adapters``), so
a third-party adapter is chosen exactly like a built-in one. What a choice needs to know about an
adapter, the adapter declares on itself:

- ``harness``: the adapter is the agent itself (a CLI harness such as Claude Code), so a run that
  names no entrypoint runs it by its name. :class:`areal.adapters.base.Adapter` says True; adapters
  that wrap the user's code (the library adapters, ``python``) say False;
- ``runs_unchanged``: the agent is a plain ``agent(episode)`` run as it is (the ``python``
  adapter), so choosing it changes nothing.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from areal.core.episode import takes_episode


class AdapterError(TypeError, ValueError):
    """An agent no adapter can run (wrong shape, unknown framework), said in one line."""


def is_adapter(agent: Any) -> bool:
    """Whether ``agent`` is already an adapter (an ``areal.wrap`` result): it has ``agent_fn``."""
    return callable(getattr(agent, "agent_fn", None)) and not inspect.isclass(agent)


def adapter_factory(framework: str, pm: Any = None, *, key: str | None = None) -> Any:
    """The adapter registered as ``framework``; an unknown name lists the registered ones."""
    from areal.core.plugins import registry

    adapters = registry("adapters", pm)
    if framework not in adapters:
        where = f"{key}: " if key else ""
        raise AdapterError(
            f"{where}no adapter named {framework!r} is registered; registered: "
            f"{', '.join(adapters.names())} (is the plugin that provides it installed?)"
        )
    return adapters.get(framework)


def is_harness(framework: str, pm: Any = None, *, key: str | None = None) -> bool:
    """Whether the adapter ``framework`` is a harness: the agent itself, run without entrypoint."""
    return bool(getattr(adapter_factory(framework, pm, key=key), "harness", False))


def choose_adapter(
    agent: Any,
    *,
    framework: str | None = None,
    options: Mapping[str, Any] | None = None,
    pm: Any = None,
    key: str | None = None,
) -> Any:
    """The adapter that runs ``agent``, or ``agent`` itself when it needs none.

    - an adapter already (an ``areal.wrap`` result) and a plain ``agent(episode)`` pass through;
    - a string without ``framework`` names a harness: ``framework`` is that string;
    - with ``framework``: the adapter registered under that name, ``factory(agent, **options)``
      (one that ``runs_unchanged`` gives the agent back);
    - without: the ``areal_wrap_agent`` hook (firstresult; the built-in guess comes last).

    ``key`` is the config key the framework came from (``agent.framework``), named in errors.
    """
    from areal.core.plugins import get_plugin_manager, registry

    pm = pm or get_plugin_manager()
    options = dict(options or {})
    if is_adapter(agent) or takes_episode(agent):
        return agent
    if framework is None and isinstance(agent, str):
        framework = agent
    if framework is not None:
        factory = adapter_factory(framework, pm, key=key)
        if getattr(factory, "runs_unchanged", False):
            return agent
        return factory(agent, **options)
    chosen = pm.hook.areal_wrap_agent(agent=agent, options=options)
    if chosen is None:
        names = ", ".join(registry("adapters", pm).names())
        fix = f"set {key} to one of {names}" if key else f"pass framework= (one of {names})"
        raise AdapterError(f"no adapter knows how to run {agent!r}; {fix}")
    return chosen


def agent_fn_of(chosen: Any) -> Any:
    """What the rollout worker calls per episode: an adapter's ``agent_fn``, else the agent."""
    return chosen.agent_fn if is_adapter(chosen) else chosen
