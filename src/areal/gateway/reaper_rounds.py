"""The rounds of the gateway's reapers (idle RL sessions, online conversations)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any


async def reap_in_rounds(
    interval: Callable[[], float],
    reap: Callable[[], Awaitable[Any]],
    log: logging.Logger,
    what: str,
    grace: Callable[[], float] | None = None,
) -> None:
    """``reap()`` every ``interval()`` seconds, forever, surviving its failures.

    A round that starts more than one interval late means the gateway itself stood still (a
    stopped or starved process, a paused machine): no client could reach it, so their silence
    is not theirs. The reaper then gives them ``grace()`` seconds (the idle timeout; one
    interval without it) to show they are alive before it reaps again. A late round right after
    a grace reaps however late it is, so a loop that lags all the time still reaps.
    """
    loop = asyncio.get_running_loop()
    grace_until: float | None = None  # set while clients get time after a stall
    while True:
        every = interval()
        due = loop.time() + every
        await asyncio.sleep(every)
        now = loop.time()
        late = now - due
        if grace_until is not None and now < grace_until:
            continue
        if late > every and grace_until is None:  # never two graces in a row
            wait = grace() if grace is not None else every
            log.info("the %s woke %.1f s late; it waits %.1f s more", what, late, wait)
            grace_until = now + wait
            continue
        grace_until = None
        try:
            await reap()
        except Exception:  # keep reaping: one failure must not leave slots held for good
            log.exception("the %s failed; it goes on", what)
