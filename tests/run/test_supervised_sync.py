"""The weight sync of a supervised run: an engine the sync's watchdog found stalled is named, killed
(so the supervisor restarts it) and left out of the retry; an engine that answered with an error
is not the watchdog's business, and the sync fails as before. Real child processes, a stand-in
sync. The grace a sync gives an engine whose connection dropped to be seen dead is proved with a
fake clock."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from areal.core.train_engine import WeightSyncError
from areal.run.supervised_sync import DIED_GRACE_S, DIED_POLL_S, SupervisedSync
from areal.run.supervisor import Child, Supervisor
from support.clock import SleepingClock
from support.processes import SLEEPER


class ScriptedSync:
    """Fails each publish with the next scripted error (``None``: succeeds), noting the engines."""

    def __init__(self, errors: list[WeightSyncError | None]) -> None:
        self.errors = errors
        self.engine_urls: list[str] = []
        self.published_to: list[list[str]] = []

    async def publish(self, model: object, version: int) -> float:
        self.published_to.append(list(self.engine_urls))
        error = self.errors.pop(0)
        if error is not None:
            raise error
        return 0.0

    async def save(self, model: object, version: int) -> float:
        return 0.0

    async def deliver(self, version: int) -> float:  # a staged sync's engine half
        return await self.publish(None, version)

    async def close(self) -> None:
        pass


def _engines(tmp_path: Path) -> tuple[Supervisor, list[Child]]:
    children = [
        Child(name=f"engine{i}", command=lambda: SLEEPER, log_path=tmp_path / f"e{i}.log")
        for i in range(2)
    ]
    return Supervisor(children), children


async def _start(supervisor: Supervisor) -> None:
    """Start the sleepers (no URL yet: nothing to health-check), then give them their URLs."""
    await supervisor.start_all()
    for i, child in enumerate(supervisor.children):
        child.url = f"http://127.0.0.1:{40000 + i}"


@pytest.mark.serial
@pytest.mark.parametrize("call", ["publish", "deliver"])
def test_a_stalled_engine_is_named_killed_and_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, call: str
) -> None:
    """The same for a whole publish and for the engines' half of a staged one (async mode
    overlaps it with the next step)."""
    supervisor, (first, second) = _engines(tmp_path)
    sync = ScriptedSync([])

    async def scenario() -> None:
        await _start(supervisor)
        stall = WeightSyncError("pause", second.url, "no answer within 5 s", stalled=True)
        sync.errors = [stall, None]
        supervised = SupervisedSync(sync, supervisor, asyncio.Lock())  # type: ignore[arg-type]
        assert supervised.staged
        if call == "publish":
            await supervised.publish(object(), 7)
        else:
            await supervised.deliver(7)

    try:
        with caplog.at_level(logging.WARNING, logger="areal.train"):
            asyncio.run(scenario())
        assert not second.running and first.running  # the supervisor's watch restarts it
        assert second.up  # still counted as up: its watch sees it died, and restarts it
        assert sync.published_to == [[first.url, second.url], [first.url]]
        (line,) = [r.getMessage() for r in caplog.records if "watchdog" in r.getMessage()]
        assert line.startswith(
            f"the weight sync's watchdog: engine1 ({second.url}, pid {second.process.pid}) "  # type: ignore[union-attr]
            "stalled in the sync of version 7 (weight sync pause failed on"
        )
    finally:
        supervisor.stop_all(timeout=2)


@pytest.mark.serial
def test_an_engine_that_answered_with_an_error_fails_the_sync(tmp_path: Path) -> None:
    supervisor, (first, second) = _engines(tmp_path)
    sync = ScriptedSync([])

    async def scenario() -> None:
        await _start(supervisor)
        sync.errors = [WeightSyncError("update", second.url, "HTTP 500: bad weights")]
        await SupervisedSync(sync, supervisor, asyncio.Lock()).publish(object(), 3)  # type: ignore[arg-type]

    try:
        with pytest.raises(WeightSyncError, match="bad weights"):
            asyncio.run(scenario())
        assert first.running and second.running
    finally:
        supervisor.stop_all(timeout=2)


# --- the grace for an engine whose connection dropped, on a fake clock -------------------------


class FakeProcess:
    """As much of a ServerProcess as the grace reads: whether it still runs."""

    def __init__(self) -> None:
        self.running = True
        self.pid = 4242


def _fake_engines() -> tuple[Supervisor, list[Child], list[FakeProcess]]:
    processes = [FakeProcess(), FakeProcess()]
    children = [
        Child(
            name=f"engine{i}",
            command=lambda: SLEEPER,
            log_path=Path(f"e{i}.log"),
            url=f"http://127.0.0.1:{40000 + i}",
            up=True,
            process=processes[i],  # type: ignore[arg-type]
        )
        for i in range(2)
    ]
    return Supervisor(children), children, processes


def _supervised(sync: ScriptedSync, supervisor: Supervisor, clock: SleepingClock) -> SupervisedSync:
    return SupervisedSync(
        sync,  # type: ignore[arg-type]
        supervisor,
        asyncio.Lock(),
        clock=clock,
        sleep=clock.asleep,
    )


def _dropped(url: str | None) -> WeightSyncError:
    return WeightSyncError("update", url, "the connection was reset")


def test_an_engine_seen_dead_within_the_grace_is_left_out_of_the_retry() -> None:
    supervisor, (first, second), (_, dying) = _fake_engines()

    def dies() -> None:
        dying.running = False

    clock = SleepingClock(
        start=0.0, on_sleep={1.0: dies}
    )  # its process is reaped 1 s after the drop
    sync = ScriptedSync([_dropped(second.url), None])
    supervised = _supervised(sync, supervisor, clock)
    asyncio.run(supervised.publish(object(), 4))
    assert sync.published_to == [[first.url, second.url], [first.url]]
    assert set(clock.slept) == {DIED_POLL_S}
    assert 1.0 <= clock.now() < 1.0 + 2 * DIED_POLL_S  # it went on as soon as the engine was gone


def test_an_engine_still_running_after_the_grace_fails_the_sync() -> None:
    supervisor, (first, second), _ = _fake_engines()
    clock = SleepingClock(start=0.0)
    sync = ScriptedSync([_dropped(second.url), None])
    supervised = _supervised(sync, supervisor, clock)
    with pytest.raises(WeightSyncError, match="the connection was reset"):
        asyncio.run(supervised.publish(object(), 4))
    assert sync.published_to == [[first.url, second.url]]  # not retried
    assert DIED_GRACE_S < clock.now() <= DIED_GRACE_S + 2 * DIED_POLL_S
