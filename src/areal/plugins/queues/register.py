"""Built-in trajectory queues and sinks."""

from __future__ import annotations

from areal.core.hookspecs import Register, hookimpl


@hookimpl
def areal_register_queues(register: Register) -> None:
    """(The JSONL sink and the ZeroMQ queue register here.)"""
