"""The reapers' rule (:mod:`areal.gateway.reaper_rounds`), proved on a fake clock: a silent
client is reaped once its silence reaches its timeout, and the seconds the gateway's own loop
stood still are nobody's silence. The rounds are ``reap_in_rounds`` itself, with a sleep that
moves the fake clock by as long as the test says each round took (its interval, or longer when
the loop stood still or lagged). Nothing here sleeps."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from areal.core.types import Completion
from areal.gateway.online import AWAITING, DISCARDED, ENDED, OPEN, OnlineConversations
from areal.gateway.reaper_rounds import LoopClock, reap_in_rounds
from areal.gateway.sessions import Session, SessionManager
from support.clock import FakeClock

TIMEOUT = 8.0  # binary-exact seconds, so the fake clock's sums are exact
EVERY = 2.0  # the reaper's interval: a quarter of the timeout, as the gateway's reapers take


class Rounds:
    """A reaper running ``reap_in_rounds(clock, EVERY, reap)`` on ``fake``, one round per
    :meth:`round`. Between rounds the test acts as the gateway's loop would (a call touches a
    session); moving ``fake`` itself first is the loop resuming before the round comes."""

    def __init__(
        self,
        fake: FakeClock,
        clock: LoopClock,
        reap: Callable[[], Awaitable[Any]],
        *,
        every: float = EVERY,
    ) -> None:
        self.fake = fake
        self.every = every
        self.results: list[Any] = []
        self._took: asyncio.Queue[float] = asyncio.Queue()
        self._done: asyncio.Queue[None] = asyncio.Queue()
        self._reap = reap
        self._task = asyncio.create_task(
            reap_in_rounds(
                clock,
                lambda: every,
                self._round,
                logging.getLogger("test"),
                "test reaper",
                sleep=self._sleep,
            )
        )

    async def _sleep(self, seconds: float) -> None:
        assert seconds == self.every
        self.fake.advance(await self._took.get())

    async def _round(self) -> None:
        try:
            self.results.append(await self._reap())
        except Exception as exc:
            self.results.append(exc)
            raise  # to reap_in_rounds, which must survive it
        finally:
            self._done.put_nowait(None)

    async def round(self, took: float | None = None) -> Any:
        """One more round, ``took`` seconds (default: its interval) after the last one; what its
        ``reap`` returned (or raised)."""
        self._took.put_nowait(self.every if took is None else took)
        await self._done.get()
        return self.results[-1]

    async def quiet(self, n: int, took: float | None = None) -> None:
        """``n`` rounds (of ``took`` seconds each) that reap nothing."""
        for _ in range(n):
            assert not await self.round(took), f"reaped {self.results[-1]}"

    def stop(self) -> None:
        self._task.cancel()


@pytest.fixture
def fake() -> FakeClock:
    return FakeClock()


def sessions_on(fake: FakeClock) -> SessionManager:
    return SessionManager("admin", idle_timeout=TIMEOUT, clock=fake)


def call(session: Session) -> None:
    """A call made with the session's key, handled: the middleware touches the session."""
    session.touch()


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


# --- the clock ---------------------------------------------------------------------------------


def test_the_loop_clock_counts_at_most_one_interval_per_round(fake: FakeClock) -> None:
    clock = LoopClock(fake)
    start = clock()
    fake.advance(100.0)
    assert clock() - start == 100.0  # no reaper yet: it is the clock itself
    assert clock.round(EVERY) == 0.0  # a reaper starts: nothing missed so far
    fake.advance(1.5)
    assert clock() - start == 101.5  # within a round it runs with the clock...
    fake.advance(30.0)
    assert clock() - start == 102.0  # ... up to the round's interval, and stands there
    assert clock.round(EVERY) == 29.5  # the round woke 29.5 s late: not counted
    fake.advance(0.5)
    assert clock() - start == 102.5


# --- the idle-session reaper ------------------------------------------------------------------


def test_a_silent_session_is_reaped_at_exactly_its_timeout(fake: FakeClock) -> None:
    sessions = sessions_on(fake)

    async def scenario() -> None:
        rounds = Rounds(fake, sessions.loop_clock, sessions.expire_idle)
        quiet = sessions.open()
        await rounds.quiet(3)
        assert await rounds.round(EVERY - 0.25) == []  # 7.75 s silent: kept
        assert await rounds.round(0.25) == [quiet.session_id]  # 8 s: reaped
        rounds.stop()
        assert quiet.summary is not None and quiet.summary["expired"] is True
        assert sessions.expired == 1 and sessions.budget.running == 0

    run(scenario)


def test_calls_keep_a_session_alive_well_past_its_timeout(fake: FakeClock) -> None:
    sessions = sessions_on(fake)

    async def scenario() -> None:
        rounds = Rounds(fake, sessions.loop_clock, sessions.expire_idle)
        alive = sessions.open()
        for _ in range(4):  # 24 s, with a call every 6 s (less than the timeout)
            await rounds.quiet(3)
            call(alive)
        await rounds.quiet(3)  # then silent: kept 6 s...
        assert await rounds.round() == [alive.session_id]
        rounds.stop()

    run(scenario)


def test_a_session_with_a_call_running_is_not_idle(fake: FakeClock) -> None:
    sessions = sessions_on(fake)

    async def scenario() -> None:
        rounds = Rounds(fake, sessions.loop_clock, sessions.expire_idle)
        busy, quiet = sessions.open(), sessions.open()
        busy.busy = 1  # a long call with its key is in flight
        assert await rounds.round(TIMEOUT * 10) == []  # (a stall counts one round)
        await rounds.quiet(2)
        assert await rounds.round() == [quiet.session_id]  # 8 s
        await rounds.quiet(10)  # the call runs on: the session stays
        busy.busy = 0
        busy.touch()  # the call is over
        await rounds.quiet(3)
        assert await rounds.round() == [busy.session_id]
        rounds.stop()

    run(scenario)
    assert sessions.expired == 2


@pytest.mark.parametrize("first", ["the round", "the call"])
def test_a_call_that_waited_through_a_stall_keeps_its_session(fake: FakeClock, first: str) -> None:
    """Silent 4 s of its 8, the client calls; the gateway's loop stands still 100 s before it
    hears the call. Whichever of the call and the reaper's late round the loop takes first when
    it resumes, the stall counts one round (2 s) of the client's silence, not 100: the call is
    heard, and the session is reaped only after a whole timeout of silence after it."""
    sessions = sessions_on(fake)

    async def scenario() -> None:
        rounds = Rounds(fake, sessions.loop_clock, sessions.expire_idle)
        caller = sessions.open()
        assert await rounds.round() == [] and await rounds.round() == []
        if first == "the round":
            assert await rounds.round(100.0) == []  # 4 + 2 s of silence: kept
            call(caller)
        else:
            fake.advance(100.0)  # the loop resumes...
            call(caller)  # ... and takes the call before the reaper's round
            assert await rounds.round(0.0) == []
        await rounds.quiet(3)
        assert await rounds.round() == [caller.session_id]
        rounds.stop()

    run(scenario)


def test_a_stall_right_after_a_stall_counts_one_round_too(fake: FakeClock) -> None:
    """Two stalls in successive rounds: each counts one round. A call that waited through the
    second keeps its session; a client silent through both is reaped when its counted silence
    reaches the timeout."""
    sessions = sessions_on(fake)

    async def scenario() -> None:
        rounds = Rounds(fake, sessions.loop_clock, sessions.expire_idle)
        caller, quiet = sessions.open(), sessions.open()
        assert await rounds.round() == []  # 2 s
        assert await rounds.round(50.0) == []  # 4 s counted
        assert await rounds.round(30.0) == []  # 6 s counted, not 82
        call(caller)
        assert await rounds.round() == [quiet.session_id]  # 8 s
        await rounds.quiet(2)
        assert await rounds.round() == [caller.session_id]
        rounds.stop()

    run(scenario)


def test_a_loop_that_lags_every_round_still_reaps_a_silent_client(fake: FakeClock) -> None:
    """Every round wakes 3 s late (more than its 2-s interval): each still counts 2 s, so a
    silent client is reaped after four rounds (20 s of the real clock)."""
    sessions = sessions_on(fake)

    async def scenario() -> None:
        rounds = Rounds(fake, sessions.loop_clock, sessions.expire_idle)
        quiet = sessions.open()
        await rounds.quiet(3, EVERY + 3.0)
        assert await rounds.round(EVERY + 3.0) == [quiet.session_id]
        rounds.stop()

    run(scenario)


def test_a_failing_round_does_not_stop_the_reaper(
    fake: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    sessions = sessions_on(fake)
    failures = iter([RuntimeError("the sink broke")])

    async def reap() -> list[str]:
        for failure in failures:
            raise failure
        return await sessions.expire_idle()

    async def scenario() -> None:
        rounds = Rounds(fake, sessions.loop_clock, reap)
        quiet = sessions.open()
        assert isinstance(await rounds.round(), RuntimeError)
        await rounds.quiet(2)
        assert await rounds.round() == [quiet.session_id]
        rounds.stop()

    run(scenario)
    assert "the test reaper failed; it goes on" in caplog.text


# --- online conversations ---------------------------------------------------------------------


def online_on(fake: FakeClock) -> OnlineConversations:
    """Conversations that end after 8 s without a call and wait 4 s for a reward; their reaper's
    rounds are 1 s (a quarter of the shorter)."""
    online = OnlineConversations(
        SessionManager("admin"), idle_timeout=TIMEOUT, reward_wait=TIMEOUT / 2, clock=fake
    )
    assert online.interval == 1.0
    return online


async def one_call(online: OnlineConversations, key: str, *, completion: bool = True) -> Any:
    """One call of conversation ``key``, over: its conversation."""
    conversation, opened = await online.admit(key)
    if completion:  # something to train: an ended conversation waits for its reward
        session = conversation.session
        session.completions.append(
            Completion("cmpl-1", session.session_id, 0, "m", [1], [2], [-0.5], [0], "stop")
        )
    await online.call_done(conversation, opened=opened, failed=False)
    return conversation


def test_an_online_conversation_ends_and_is_discarded_at_exactly_its_times(
    fake: FakeClock,
) -> None:
    """Idle ``idle_timeout`` after its last call it ends; ``reward_wait`` later without a reward
    it is discarded; a stall of the loop counts one round (1 s) of either."""
    online = online_on(fake)

    async def scenario() -> None:
        rounds = Rounds(fake, online.loop_clock, online.expire, every=online.interval)
        conversation = await one_call(online, "agent")
        await rounds.round(50.0)  # the loop stood still: 1 s counted
        await rounds.quiet(6)
        await rounds.round(0.75)  # 7.75 s idle
        assert conversation.state == OPEN
        await rounds.round(0.25)  # 8 s
        assert conversation.state == AWAITING
        await rounds.round(100.0)  # 1 s of the reward wait counted
        await rounds.quiet(2)
        await rounds.round(0.75)  # 3.75 s
        assert conversation.state == AWAITING
        await rounds.round(0.25)  # 4 s
        assert conversation.state == DISCARDED
        rounds.stop()

    run(scenario)
    assert online.counts == {"opened": 1, ENDED: 0, DISCARDED: 1}


def test_a_call_that_waited_through_a_stall_keeps_its_conversation(fake: FakeClock) -> None:
    online = online_on(fake)

    async def scenario() -> None:
        rounds = Rounds(fake, online.loop_clock, online.expire, every=online.interval)
        conversation = await one_call(online, "agent")
        await rounds.quiet(6)  # 6 s idle
        fake.advance(100.0)  # the loop stood still; it resumes and hears a call at once
        assert await one_call(online, "agent", completion=False) is conversation
        await rounds.round(0.0)
        await rounds.quiet(7)
        assert conversation.state == OPEN  # 7 s after the call
        await rounds.round()
        assert conversation.state == AWAITING
        rounds.stop()

    run(scenario)
