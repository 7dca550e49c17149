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
) -> None:
    """``reap()`` every ``interval()`` seconds, forever, surviving its failures.

    A round that starts more than one interval late, and more than twice as late as the round
    before, is skipped: the gateway itself stood still (a stopped or starved process, a paused
    machine), so no client could reach it and their silence is not theirs. The next round, an
    interval later, gives them the time to show they are alive. A loop that lags all the time
    (each round about as late as the last) still reaps. (The rule was "never skip twice in a
    row": a round made late by load, then a stall, reaped at once after the stall, before a
    call that had waited through it was heard.)
    """
    loop = asyncio.get_running_loop()
    last_late = 0.0
    while True:
        every = interval()
        due = loop.time() + every
        await asyncio.sleep(every)
        late = loop.time() - due
        skip = stood_still(late, last_late, every)
        last_late = late
        if skip:
            log.info("the %s woke %.1f s late; it waits one more round", what, late)
            continue
        try:
            await reap()
        except Exception:  # keep reaping: one failure must not leave slots held for good
            log.exception("the %s failed; it goes on", what)


def stood_still(late: float, last_late: float, every: float) -> bool:
    """Whether a round ``late`` seconds late (the round before: ``last_late``) follows a stall
    of the gateway's own loop, rather than the lag it always has."""
    return late > every and late > 2 * last_late
