"""Built-in trajectory queues and sinks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from areal.core.hookspecs import Register, hookimpl
from areal.plugins.queues.jsonl import jsonl_sink

if TYPE_CHECKING:
    from areal.plugins.queues.zmq_queue import ZmqTrajectorySink, ZmqTrajectorySource


def zmq_sink(options: dict[str, Any]) -> ZmqTrajectorySink:
    """The ZeroMQ producer; imported on use, so start-up does not pay for zmq and numpy."""
    from areal.plugins.queues.zmq_queue import zmq_sink as make

    return make(options)


def zmq_source(options: dict[str, Any]) -> ZmqTrajectorySource:
    """The trainer's end: ``options.address`` to bind (``tcp://127.0.0.1:*`` picks a port),
    ``options.queue_max_size``, ``options.on_receipt`` (called with each trajectory received)."""
    from areal.plugins.queues.zmq_queue import ZmqTrajectorySource

    return ZmqTrajectorySource(
        options.get("address", "tcp://127.0.0.1:*"),
        queue_max_size=int(options.get("queue_max_size", 64)),
        on_receipt=options.get("on_receipt"),
    )


@hookimpl
def areal_register_queues(register: Register) -> None:
    """The JSONL sink and the ZeroMQ trajectory queue (``options.address``: the trainer's)."""
    register("jsonl", jsonl_sink)
    register("zmq", zmq_sink)
    register("zmq/source", zmq_source)
