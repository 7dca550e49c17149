"""How long a rollout worker waits for a free slot under the staleness budget, proved on a fake
clock: ``429`` answers are waited out by their ``Retry-After`` up to ``max_wait_s`` and no
longer, and a long poll the gateway held counts as waiting but asks again at once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from areal.run.gateway_client import GatewayBusy
from areal.run.rollout import LONG_POLL_S, RolloutError, RolloutStats, RolloutWorker
from support.clock import FakeClock, SleepingClock


class FullGateway:
    """Answers every session request ``429`` after holding it ``hold_s`` (a long poll)."""

    def __init__(self, clock: FakeClock, retry_after: float, hold_s: float = 0.0) -> None:
        self.clock, self.retry_after, self.hold_s = clock, retry_after, hold_s
        self.asked: list[tuple[float, float]] = []  # (when, wait_s)

    async def open_session(self, *, wait_s: float, **fields: Any) -> Any:
        self.asked.append((self.clock(), wait_s))
        self.clock.advance(min(self.hold_s, wait_s))
        raise GatewayBusy(
            url="http://gw",
            call="POST /rl/sessions",
            status=429,
            reason="budget full",
            retry_after=self.retry_after,
        )


def worker(clock: SleepingClock, max_wait_s: float) -> RolloutWorker:
    async def agent(episode: Any) -> None:
        return None

    return RolloutWorker(
        "http://gw", "admin", agent, max_wait_s=max_wait_s, clock=clock, sleep=clock.asleep
    )


def test_retry_after_is_waited_out_until_max_wait_s_and_then_the_run_is_told() -> None:
    clock = SleepingClock()
    gateway = FullGateway(clock, retry_after=2.0)
    stats = RolloutStats()
    started = clock()
    with pytest.raises(RolloutError, match=r"stayed full for 4\.0s \(max_wait_s=5\.0\)"):
        asyncio.run(worker(clock, max_wait_s=5.0)._open(gateway, stats, {}))  # type: ignore[arg-type]
    assert clock.slept == [2.0, 2.0]  # a third wait would end past max_wait_s: it is not begun
    assert [at - started for at, _ in gateway.asked] == [0.0, 2.0, 4.0]
    assert stats.waited_s == 4.0


def test_a_long_poll_held_to_its_end_asks_again_at_once_and_counts_as_waiting() -> None:
    clock = SleepingClock()
    gateway = FullGateway(clock, retry_after=30.0, hold_s=LONG_POLL_S)
    stats = RolloutStats()
    with pytest.raises(RolloutError, match=r"stayed full for 25\.0s"):
        asyncio.run(worker(clock, max_wait_s=25.0)._open(gateway, stats, {}))  # type: ignore[arg-type]
    assert clock.slept == [0.0, 0.0, 0.0]  # held to the end each time: no Retry-After on top
    # The polls fill max_wait_s exactly; a last look without waiting finds the budget still full,
    # and its Retry-After would end past max_wait_s.
    assert [wait for _, wait in gateway.asked] == [LONG_POLL_S, LONG_POLL_S, 5.0, 0.0]
    assert stats.waited_s == 25.0
