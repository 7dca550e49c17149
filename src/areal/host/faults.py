"""Named crash points, for the fault tests: the process dies by SIGKILL, or stops, exactly there.

``AREAL_TEST_CRASH_AT=checkpoint.synced`` makes the next :func:`crash_point` of that name
SIGKILL its own process, as a power cut or the OOM killer would: no ``finally``, no ``atexit``,
no flush. The points sit between the steps of rare, slow operations (a checkpoint's phases) or
at most once per episode (the gateway's hand-over of a trajectory, a rollout worker's episode
just opened), never in a per-token or per-sample path; unset, each costs one environment
look-up per variable.

``AREAL_TEST_STOP_AT=weight_sync.to_engines`` makes every :func:`crash_point` of that name stop
its own process (SIGSTOP) until another sends SIGCONT: a test holds the process exactly there,
acts (stops an engine the next calls go to, kills the held process), and lets it go on, with
nothing left to timing. The value is a comma-separated list of points; an entry
``name@/path/to/file`` stops at ``name`` only while that file exists, so a test *arms* the stop
when it wants it (creates the file) instead of stopping at every pass (the path holds no comma).

:func:`trace` records the points an operation passes, so a test can check that the phases it
kills at are all the phases there are.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

__all__ = ["CRASH_ENV", "STOP_ENV", "crash_point", "stops_at", "trace"]

CRASH_ENV = "AREAL_TEST_CRASH_AT"
STOP_ENV = "AREAL_TEST_STOP_AT"

_traces: list[list[str]] = []


def crash_point(name: str) -> None:
    """Die here (SIGKILL) when :data:`CRASH_ENV` names this point, stop here (SIGSTOP, until a
    SIGCONT) when :data:`STOP_ENV` does (:func:`stops_at`); note it for :func:`trace` and go on."""
    for reached in _traces:
        reached.append(name)
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
    stop = os.environ.get(STOP_ENV)
    if stop and stops_at(name, stop):
        os.kill(os.getpid(), signal.SIGSTOP)


def stops_at(name: str, spec: str) -> bool:
    """Whether a :data:`STOP_ENV` value ``spec`` stops point ``name`` now: an entry ``name``
    always, an entry ``name@path`` while ``path`` exists."""
    for entry in spec.split(","):
        point, armed, path = entry.strip().partition("@")
        if point == name and (not armed or os.path.exists(path)):
            return True
    return False


@contextlib.contextmanager
def trace() -> Iterator[list[str]]:
    """``with trace() as reached:`` the names of the crash points passed inside, in order."""
    reached: list[str] = []
    _traces.append(reached)
    try:
        yield reached
    finally:
        _traces.remove(reached)
