"""Built-in tool-call parsers."""

from __future__ import annotations

from areal.core.hookspecs import Register, hookimpl
from areal.plugins.tool_parsers.hermes import HermesParser


@hookimpl
def areal_register_tool_parsers(register: Register) -> None:
    register("hermes", HermesParser)
    register("qwen", HermesParser)
