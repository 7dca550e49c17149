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

    A round that starts more than one interval late is skipped: the gateway itself stood still
    (a stopped or starved process, a paused machine), so no client could reach it and their
    silence is not theirs. The next round, an interval later, gives them the time to show they
    are alive; it reaps however late it is, so a loop that lags all the time still reaps.
    """
    loop = asyncio.get_running_loop()
    skipped = False
    while True:
        every = interval()
        due = loop.time() + every
        await asyncio.sleep(every)
        late = loop.time() - due
        if late > every and not skipped:  # never twice in a row: a loaded loop still reaps
            log.info("the %s woke %.1f s late; it waits one more round", what, late)
            skipped = True
            continue
        skipped = False
        try:
            await reap()
        except Exception:  # keep reaping: one failure must not leave slots held for good
            log.exception("the %s failed; it goes on", what)
