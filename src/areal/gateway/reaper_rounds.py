"""The rounds of the gateway's reapers (idle RL sessions, online conversations), and what they
count as a client's silence."""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

STALLS_KEPT = 64  # a session silent across more stalls than this is only reaped sooner
LAG_ROUNDS = 8  # the rounds whose median lateness is the loop's usual lag


class Hearing:
    """The times the gateway's own loop stood still (a stopped or starved process, a paused
    machine): no client could reach it then, so those seconds are nobody's silence. Times are
    ``time.monotonic()``'s, as the sessions' ``last_active``."""

    def __init__(self) -> None:
        self._stalls: deque[tuple[float, float]] = deque(maxlen=STALLS_KEPT)

    def stood_still(self, start: float, end: float) -> None:
        self._stalls.append((start, end))

    def silence(self, since: float, now: float) -> float:
        """The seconds from ``since`` to ``now`` during which the gateway was listening. (The
        stalls come in order: the newest first, and none before ``since`` is looked at, so a
        reaper round costs one comparison per session in the usual case of no stall.)"""
        deaf = 0.0
        for start, end in reversed(self._stalls):
            if end <= since:
                break
            deaf += max(0.0, min(end, now) - max(start, since))
        return max(0.0, now - since - deaf)


async def reap_in_rounds(
    interval: Callable[[], float],
    reap: Callable[[Hearing], Awaitable[Any]],
    log: logging.Logger,
    what: str,
) -> None:
    """``reap(hearing)`` every ``interval()`` seconds, forever, surviving its failures.

    A round that wakes late by more than one interval beyond the loop's usual lag (the median
    lateness of its recent rounds) shows the gateway stood still: for those seconds a client's
    call could not be heard, and ``hearing`` takes them out of every client's silence. So a call
    that waited through a stall has the rest of its idle timeout to be heard once the loop
    resumes, even right after another stall (a rule comparing a round with the one before
    missed that); a loop that lags the same every round hears its clients late, and its lag
    counts as their silence (taking it out too kept a lagging gateway from ever reaping).
    """
    loop = asyncio.get_running_loop()
    hearing = Hearing()
    recent: deque[float] = deque(maxlen=LAG_ROUNDS)
    while True:
        every = interval()
        due = loop.time() + every
        await asyncio.sleep(every)
        late = loop.time() - due
        deaf = stall_beyond_lag(late, recent, every)
        recent.append(late)
        if deaf > 0:
            woke = time.monotonic()  # the sessions' clock (an event loop may keep its own)
            hearing.stood_still(woke - deaf, woke)
            log.info("the %s woke %.1f s late: %.1f s of it is nobody's silence", what, late, deaf)
        try:
            await reap(hearing)
        except Exception:  # keep reaping: one failure must not leave slots held for good
            log.exception("the %s failed; it goes on", what)


def stall_beyond_lag(late: float, recent: Sequence[float], every: float) -> float:
    """The seconds of a round ``late`` seconds late that the gateway stood still: its lateness
    beyond the median of the ``recent`` rounds', when that is more than one interval."""
    lag = statistics.median(recent) if recent else 0.0
    return late - lag if late - lag > every else 0.0
