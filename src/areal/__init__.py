"""areal: fully asynchronous RL for LLM agents. Importing this package never imports torch."""

from __future__ import annotations

from typing import Any

from areal.core.hookspecs import hookimpl
from areal.core.version import __version__


def wrap(agent: Any, *, framework: str | None = None, **options: Any) -> Any:
    """Hand an existing agent to areal in one line: ``my_agent = areal.wrap(agent)``.

    ``agent``: a function ``(task, client)`` (sync or async), an object with ``run(task, **kw)``,
    a LangChain runnable, or a harness name (``"claude_code"``). The ``areal_wrap_agent`` hook picks
    the adapter unless ``framework`` names one. The result is an ``AgentFn`` a run config's
    ``agent.entrypoint`` can name. See docs/adapters.md.
    """
    from areal.adapters.wrap import wrap as wrap_with_plugins  # loads only when used

    return wrap_with_plugins(agent, framework=framework, **options)


__all__ = ["__version__", "hookimpl", "wrap"]
