"""The event loop areal's long-running processes run on: uvloop where it is installed.

Why: the gateway and the rollout workers spend most of their
CPU in the event loop and its transports (accepting, reading and writing sockets, scheduling
callbacks), not in areal's own code. uvloop implements the same ``asyncio`` loop on libuv in C;
the numbers it bought are in docs/benchmarks.md ("Gateway overhead"). In a training run the
gateway and the workers share the trainer's core, so what they save is the trainer's time.

``AREAL_EVENT_LOOP`` chooses: ``auto`` (the default: uvloop if importable, else asyncio's),
``uvloop`` (an error if it is missing) or ``asyncio`` (the standard loop, e.g. to rule uvloop
out while debugging). Windows has no uvloop; ``auto`` falls back there.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

ENV = "AREAL_EVENT_LOOP"
CHOICES = ("auto", "uvloop", "asyncio")

T = TypeVar("T")


class EventLoopChoiceError(ValueError):
    """``AREAL_EVENT_LOOP`` holds something other than the choices, or asks for a missing uvloop."""


def loop_choice() -> str:
    """What ``AREAL_EVENT_LOOP`` asks for; a bad value names the variable and the choices."""
    choice = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise EventLoopChoiceError(
            f"{ENV}={os.environ[ENV]!r} is not one of {', '.join(CHOICES)}; "
            f"unset it for the default (auto: uvloop when installed)"
        )
    return choice


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new loop of the chosen kind (see the module docstring)."""
    choice = loop_choice()
    if choice == "asyncio":
        return asyncio.new_event_loop()
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise EventLoopChoiceError(
                f"{ENV}=uvloop, but uvloop is not installed: pip install uvloop, "
                f"or set {ENV}=asyncio"
            ) from None
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """``uvloop`` or ``asyncio``: for the logs, which say what a process serves on."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on a loop from :func:`new_event_loop`."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)
