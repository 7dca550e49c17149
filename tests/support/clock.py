"""A clock the test moves by hand: what a rule that depends on time is proved with.

A product rule that reads the time (a reaper's timeout, a lease, a backoff) takes the clock as a
parameter (a ``Callable[[], float]``, ``time.monotonic`` by default); a test passes a
:class:`FakeClock` and ``advance``\\ s it, so the rule is checked at the exact second it is meant
to fire, without sleeping and whatever the machine's speed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class FakeClock:
    """Seconds that pass only when :meth:`advance` says so. Call it (or :meth:`now`) to read it.

    It starts at ``start`` (not 0, so that code subtracting readings finds no special value);
    the default is a power of two, so that the sums of binary-exact steps stay exact."""

    def __init__(self, start: float = 1024.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def __call__(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        """Let ``seconds`` pass (never backwards); returns the new time."""
        if seconds < 0:
            raise ValueError(f"a clock does not run backwards ({seconds} s)")
        self._now += seconds
        return self._now


class FakeSleeps:
    """``asyncio.sleep`` on a :class:`FakeClock`, for an async rule that waits out a timeout (a
    watchdog, a close that waits for acknowledgements) and takes its sleep as a parameter:
    :meth:`sleep` returns once :meth:`advance` has moved the clock to its end, never by itself,
    so the test says when the timeout has passed."""

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.clock = clock if clock is not None else FakeClock()
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    @property
    def sleeping(self) -> int:
        """How many sleeps are under way: the rule has started its timer."""
        return sum(1 for _, woken in self._sleepers if not woken.done())

    async def sleep(self, seconds: float) -> None:
        woken = asyncio.get_running_loop().create_future()
        self._sleepers.append((self.clock() + seconds, woken))
        await woken

    def advance(self, seconds: float) -> float:
        """Let ``seconds`` pass, waking every sleep that ends by then; returns the new time."""
        now = self.clock.advance(seconds)
        for end, woken in self._sleepers:
            if end <= now and not woken.done():
                woken.set_result(None)
        self._sleepers = [(end, woken) for end, woken in self._sleepers if not woken.done()]
        return now


class SleepingClock(FakeClock):
    """A :class:`FakeClock` that the code under test moves by sleeping: each sleep (``sleep`` for
    a synchronous rule, as :mod:`areal.host.clock` has it, ``asleep`` for an async one) passes
    at once, is recorded in ``slept``, and runs the ``on_sleep`` actions whose time has come (a
    process reaped 1 s into a grace). ``monotonic`` reads it, so it is a ``host.clock.Clock``."""

    def __init__(
        self, start: float = 1024.0, on_sleep: dict[float, Callable[[], None]] | None = None
    ) -> None:
        super().__init__(start)
        self.start = start
        self.slept: list[float] = []
        self.on_sleep = dict(on_sleep or {})

    def monotonic(self) -> float:
        return self.now()

    def sleep(self, seconds: float, /) -> None:
        self.slept.append(seconds)
        self.advance(seconds)
        for at in [t for t in self.on_sleep if t <= self.now()]:
            self.on_sleep.pop(at)()

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)

    @property
    def elapsed(self) -> float:
        return self.now() - self.start
