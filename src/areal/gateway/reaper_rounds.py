"""The rounds of the gateway's reapers (idle RL sessions, online conversations), and the clock a
client's silence is measured on.

What a user needs of a reaper, and nothing more:

- a client that stays silent is reaped once its silence reaches its timeout (a crashed rollout
  worker must not hold its budget slots for good);
- a client is not reaped for the gateway's own stall. While the gateway's event loop stands
  still (its process stopped or starved, the machine paused) no client can be heard: a call sent
  then waits in the socket until the loop runs again, and reaping its client first would punish
  it for the gateway's fault.

The rule that meets both: silence is measured on a :class:`LoopClock`, which follows the real
clock but counts at most one reaper round's interval from one round to the next. The rounds are
the evidence that the loop ran, so the seconds a round woke late are counted for no one:

- a silent client is reaped by the first round at which its counted silence reaches its
  timeout; on a loop that keeps time, that is its timeout in real seconds;
- a stall, however long, adds at most one interval (a quarter of the timeout, at most 5 s) to
  any client's silence, so a call that waited through it is heard when the loop resumes; only a
  client already silent to within one interval of its timeout when the loop stood still can be
  reaped first. A stall right after a stall adds one interval more: each is just a late round;
- a loop that lags every round still counts one interval a round, so it still reaps a silent
  client, later in real time by the lag's share.

Nothing is remembered of the stalls (no list of them, no usual lag to estimate): the clock is two
numbers. Both the clock and the sleep between rounds are parameters, so the rule is proved on a
fake clock (``tests/gateway/test_reaper_rounds.py``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any


class LoopClock:
    """Seconds during which the gateway's loop could hear its clients: ``clock`` (injectable,
    ``time.monotonic`` by default), less whatever a round of the reaper took beyond its interval.

    Read it (``loop_clock()``) for every time a client's silence is measured from or to (the
    sessions' and online conversations' ``last_active``). Between two rounds it runs with
    ``clock``, up to one interval; until a reaper runs rounds, it is ``clock`` itself (offset).
    It never runs backwards.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._at = clock()  # ``clock`` at the last round
        self._counted = self._at  # this clock at the last round
        self._round_s = math.inf  # the most the current round counts

    def __call__(self) -> float:
        return self._counted + min(self.clock() - self._at, self._round_s)

    def round(self, next_round_s: float) -> float:
        """A round of the reaper: the loop runs now. The round just over counts its seconds up
        to its interval, and the next counts at most ``next_round_s``. Returns the seconds not
        counted (the loop stood still or lagged that long)."""
        now = self.clock()
        elapsed = now - self._at
        counted = min(elapsed, self._round_s)
        self._counted += counted
        self._at = now
        self._round_s = next_round_s
        return elapsed - counted


async def reap_in_rounds(
    clock: LoopClock,
    interval: Callable[[], float],
    reap: Callable[[], Awaitable[Any]],
    log: logging.Logger,
    what: str,
    *,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> None:
    """Every ``interval()`` seconds, a round of ``clock`` and then ``reap()``, forever, surviving
    the failures of ``reap``. ``sleep`` is a parameter for the tests' fake clock."""
    every = interval()
    clock.round(every)  # from here on, a round counts at most its interval
    while True:
        await sleep(every)
        every_before, every = every, interval()
        missed = clock.round(every)
        if missed > every_before:
            log.info("the %s woke %.1f s late: those seconds are nobody's silence", what, missed)
        try:
            await reap()
        except Exception:  # keep reaping: one failure must not leave slots held for good
            log.exception("the %s failed; it goes on", what)
