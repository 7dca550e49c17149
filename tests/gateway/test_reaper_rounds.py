"""What the reapers count as a client's silence: not the seconds the gateway's own loop stood
still (``Hearing``), as a round that woke late beyond the loop's usual lag shows them."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from areal.gateway.online import OPEN, OnlineConversations
from areal.gateway.reaper_rounds import Hearing, reap_in_rounds, stall_beyond_lag
from areal.gateway.sessions import SessionManager


def test_a_stall_is_the_lateness_beyond_the_loops_usual_lag() -> None:
    every = 0.5
    quiet = [0.0] * 8
    assert stall_beyond_lag(4.5, quiet, every) == 4.5  # the loop stood still 4.5 s
    assert stall_beyond_lag(0.3, quiet, every) == 0.0  # jitter within a round
    # a stall right after another: the first does not make the second the usual lag
    assert stall_beyond_lag(0.55, [*quiet[1:], 0.45], every) == 0.55
    # a loop 4 s late every round hears its clients late: its lag is their silence...
    assert stall_beyond_lag(4.1, [4.0] * 8, every) == 0.0
    # ... and a stall on top of it is taken out
    assert stall_beyond_lag(9.0, [4.0] * 8, every) == 5.0
    assert stall_beyond_lag(4.5, [], every) == 4.5  # the first round


def test_silence_leaves_out_the_stalls_it_overlaps() -> None:
    hearing = Hearing()
    assert hearing.silence(100.0, 110.0) == 10.0
    hearing.stood_still(102.0, 106.0)
    assert hearing.silence(100.0, 110.0) == 6.0  # 4 s of the 10 deaf
    assert hearing.silence(104.0, 110.0) == 4.0  # silent from mid-stall: 2 s of it deaf
    assert hearing.silence(106.0, 110.0) == 4.0  # after the stall: all heard
    assert hearing.silence(100.0, 103.0) == 2.0  # now in the stall: 1 s of it so far
    hearing.stood_still(108.0, 109.5)
    assert hearing.silence(100.0, 110.0) == 4.5  # two stalls, 5.5 s deaf
    assert hearing.silence(103.0, 103.5) == 0.0  # all of it deaf


def test_a_session_silent_through_a_stall_is_reaped_a_whole_timeout_of_hearing_later() -> None:
    sessions = SessionManager("admin", idle_timeout=10.0)

    async def scenario() -> tuple[list[str], list[str], str]:
        quiet = sessions.open()
        t = quiet.last_active
        hearing = Hearing()
        hearing.stood_still(t + 2.0, t + 8.0)
        # 11 s by the clock, 5 s heard: kept; 16 s by the clock, 10 heard: reaped.
        first = await sessions.expire_idle(hearing, now=t + 11.0)
        second = await sessions.expire_idle(hearing, now=t + 16.0)
        return first, second, quiet.session_id

    first, second, quiet = asyncio.run(scenario())
    assert first == []
    assert second == [quiet]


def test_online_conversations_count_the_same_silence() -> None:
    sessions = SessionManager("admin")
    online = OnlineConversations(sessions, idle_timeout=10.0, reward_wait=5.0)

    async def scenario() -> tuple[str, str]:
        conversation, opened = await online.admit("agent-key")
        await online.call_done(conversation, opened=opened, failed=False)
        t = conversation.last_active
        hearing = Hearing()
        hearing.stood_still(t + 1.0, t + 9.0)
        await online.expire(hearing, now=t + 12.0)  # 4 s heard of 12
        kept = conversation.state
        await online.expire(hearing, now=t + 18.5)  # 10.5 s heard: ended
        return kept, conversation.state

    kept, later = asyncio.run(scenario())
    assert kept == OPEN
    assert later != OPEN


def test_a_round_after_the_loop_stood_still_hands_the_stall_to_reap() -> None:
    """On a real event loop: a callback blocks it 0.6 s; the round that wakes late gives
    ``reap`` a ``Hearing`` holding that stall (measured on ``time.monotonic()``, the sessions'
    clock), and the rounds before it none."""
    seen: list[tuple[float, float]] = []

    async def main() -> tuple[float, float]:  # when the loop stood still, when it resumed
        async def reap(hearing: Hearing) -> None:
            now = time.monotonic()
            seen.append((now, hearing.silence(now - 2.0, now)))

        task = asyncio.create_task(
            reap_in_rounds(lambda: 0.05, reap, logging.getLogger("test"), "test reaper")
        )
        await asyncio.sleep(0.3)
        blocked = time.monotonic()
        time.sleep(0.6)  # the loop stands still
        resumed = time.monotonic()
        await asyncio.sleep(0.2)
        task.cancel()
        return blocked, resumed

    blocked, resumed = asyncio.run(main())
    before = [heard for at, heard in seen if at < blocked]
    assert before and all(heard == pytest.approx(2.0) for heard in before)
    # In the 2 s before the first round after it: the stall past that round's due time is
    # taken out (at least 0.55 s of the 0.6, the round being due at most 0.05 s into it), and
    # no more than from the stall's start to that round.
    at, heard = next((at, heard) for at, heard in seen if at >= resumed)
    assert 0.55 - 0.01 <= 2.0 - heard <= at - blocked + 0.01


def test_a_stall_right_after_another_is_taken_out_too() -> None:
    """The loop stands still 0.5 s, and again 0.6 s in the round that noticed it (the case a
    rule comparing each round's lateness with the one before missed: 0.6 s is less than twice
    0.5): ``reap`` sees both stalls taken out."""
    heard: list[float] = []

    async def main() -> None:
        first_stall_at = -1  # the number of rounds before the first stall

        async def reap(hearing: Hearing) -> None:
            now = time.monotonic()
            heard.append(hearing.silence(now - 3.0, now))
            if len(heard) == first_stall_at + 1:  # the round that noticed the first stall
                asyncio.get_running_loop().call_soon(time.sleep, 0.6)  # the second, next

        task = asyncio.create_task(
            reap_in_rounds(lambda: 0.05, reap, logging.getLogger("test"), "test reaper")
        )
        await asyncio.sleep(0.2)
        first_stall_at = len(heard)
        time.sleep(0.5)  # the first
        await asyncio.sleep(1.0)
        task.cancel()

    asyncio.run(main())
    # 3 s back from the last round: both stalls, less at most a round each, are taken out.
    assert 3.0 - heard[-1] >= (0.5 - 0.05) + (0.6 - 0.05) - 0.01
