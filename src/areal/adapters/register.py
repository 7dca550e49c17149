"""The built-in adapters, registered through the same hooks as a third-party adapter's."""

from __future__ import annotations

from typing import Any

from areal.core.hookspecs import Register, hookimpl


@hookimpl
def areal_register_adapters(register: Register) -> None:
    from areal.adapters.wrap import BUILTIN

    for name, factory in BUILTIN.items():
        register(name, factory)


@hookimpl(trylast=True)
def areal_wrap_agent(agent: Any, options: dict[str, Any]) -> Any:
    """The built-in guess comes last: any plugin that claims the agent first wins."""
    from areal.adapters.wrap import builtin_choice

    return builtin_choice(agent, options)
