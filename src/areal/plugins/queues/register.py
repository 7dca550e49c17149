"""Built-in trajectory queues and sinks."""

from __future__ import annotations

from areal.core.hookspecs import Register, hookimpl
from areal.plugins.queues.jsonl import jsonl_sink


@hookimpl
def areal_register_queues(register: Register) -> None:
    """The JSONL sink; the ZeroMQ queue registers here with the asynchronous core."""
    register("jsonl", jsonl_sink)
