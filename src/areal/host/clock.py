"""The clock a time rule reads and waits on, as a parameter.

A rule that depends on time (a health wait's timeout, a stop's grace before SIGKILL, a polling
interval) takes a :class:`Clock` instead of calling :mod:`time` itself, so a test can hand it a
fake one whose time moves only when the rule sleeps: the rule is then proved to the instant,
without waiting for it, on a machine of any speed. In a run the clock is :data:`SYSTEM_CLOCK`.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["SYSTEM_CLOCK", "Clock"]


class Clock(Protocol):
    """Monotonic seconds and a way to wait some of them (the :mod:`time` module is one)."""

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float, /) -> None: ...


SYSTEM_CLOCK: Clock = time  # the real one: time.monotonic and time.sleep
