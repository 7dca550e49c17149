"""The supervisor restarts real child processes that die, and gives up with the child's name and
log once it has restarted it too often. Real children: the serial tier."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from areal.host.process import pick_free_port
from areal.run.supervisor import Child, ChildFailed, Supervisor
from support import eventually_async
from support.processes import HEALTH_SERVER, SLEEPER, someone_else_on

pytestmark = pytest.mark.serial

CRASHER = [sys.executable, "-c", "import sys; print('boom: bad config', flush=True); sys.exit(3)"]


def test_a_dead_child_is_restarted_with_its_hooks(tmp_path: Path) -> None:
    events: list[str] = []
    commands = iter([SLEEPER, SLEEPER])

    async def before(child: Child) -> None:
        events.append(f"before {child.restarts}")

    async def after(child: Child) -> None:
        events.append(f"after pid={child.process.pid if child.process else None}")

    child = Child(
        name="worker0",
        command=lambda: next(commands),
        log_path=tmp_path / "w.log",
        before_restart=before,
        after_start=after,
    )
    supervisor = Supervisor([child], poll_interval=0.05)

    async def scenario() -> None:
        await supervisor.start_all()
        first = child.process.pid if child.process else None
        assert first is not None
        watch = asyncio.create_task(supervisor.watch())
        os.kill(first, signal.SIGKILL)
        await eventually_async(lambda: child.restarts == 1 and child.up, 60, "worker0 back")
        assert child.up and child.running and child.process and child.process.pid != first
        watch.cancel()

    try:
        asyncio.run(scenario())
    finally:
        supervisor.stop_all(timeout=2)
    assert (
        events[0].startswith("after") and events[1] == "before 1" and events[2].startswith("after")
    )
    assert not child.running


def test_a_child_that_keeps_dying_fails_the_run_with_its_log(tmp_path: Path) -> None:
    child = Child(
        name="rollout3", command=lambda: CRASHER, log_path=tmp_path / "r.log", max_restarts=2
    )
    supervisor = Supervisor([child], poll_interval=0.05)

    async def scenario() -> None:
        await supervisor.start_all()
        await supervisor.watch()

    with pytest.raises(ChildFailed, match=r"rollout3 exited with code 3 .* restarted 2 times"):
        try:
            asyncio.run(scenario())
        finally:
            supervisor.stop_all(timeout=2)
    assert (tmp_path / "r.log").read_text().count("boom: bad config") == 3


def test_start_all_starts_stages_in_order_and_reports_unhealthy(tmp_path: Path) -> None:
    order: list[str] = []

    def command(name: str) -> list[str]:
        order.append(name)
        return SLEEPER

    early = Child(name="engine0", command=lambda: command("engine0"), log_path=tmp_path / "e")
    late = Child(
        name="gateway",
        command=lambda: command("gateway"),
        log_path=tmp_path / "g",
        stage=1,
        url="http://127.0.0.1:9",  # nothing listens: never healthy
        start_timeout=0.5,
    )
    supervisor = Supervisor([late, early])
    with pytest.raises(ChildFailed, match="gateway"):
        try:
            asyncio.run(supervisor.start_all())
        finally:
            supervisor.stop_all(timeout=2)
    assert order == ["engine0", "gateway"]


def test_a_child_with_nice_runs_at_that_niceness(tmp_path: Path) -> None:
    """``agent.nice`` (e.g. 5, to yield a shared core to the engine or the trainer) is added to
    the real process's niceness as it starts."""
    child = Child(name="gateway", command=lambda: SLEEPER, log_path=tmp_path / "g", nice=5)
    supervisor = Supervisor([child], poll_interval=0.05)
    try:
        asyncio.run(supervisor.start_all())
        assert child.process is not None and child.process.pid is not None
        ours = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, child.process.pid) == min(19, ours + 5)
    finally:
        supervisor.stop_all(timeout=2)


def test_a_child_with_cpus_runs_on_those_cores(tmp_path: Path) -> None:
    """The placement the run config asks for (``inference.cpu_affinity``, ``agent.cpu_affinity``)
    is the real process's CPU mask, set as it starts."""
    core = min(os.sched_getaffinity(0))
    child = Child(name="gateway", command=lambda: SLEEPER, log_path=tmp_path / "g", cpus={core})
    supervisor = Supervisor([child], poll_interval=0.05)
    try:
        asyncio.run(supervisor.start_all())
        assert child.process is not None and child.process.pid is not None
        assert os.sched_getaffinity(child.process.pid) == {core}
    finally:
        supervisor.stop_all(timeout=2)


@pytest.mark.parametrize("moves", [True, False])
def test_a_restart_whose_port_was_taken_moves_only_a_child_that_may(
    moves: bool, tmp_path: Path
) -> None:
    """A dead child's port is free for anyone until its restart binds it. An engine (a child
    that ``moves_when_taken``) restarts on another port and its ``after_start`` learns the new
    url, which the run's catch-up passes on; any other child keeps the url the rest of the run
    knows it by, so it fails, naming the taken port."""
    port = [pick_free_port()]

    def command() -> list[str]:
        return [sys.executable, "-c", HEALTH_SERVER, str(port[0])]

    def new_port() -> str:
        port[0] = pick_free_port()
        return f"http://127.0.0.1:{port[0]}"

    started: list[str | None] = []

    async def after(child: Child) -> None:
        started.append(child.url)

    child = Child(
        name="engine0",
        command=command,
        log_path=tmp_path / "engine0.log",
        url=f"http://127.0.0.1:{port[0]}",
        new_port=new_port,
        moves_when_taken=moves,
        after_start=after,
        start_timeout=30,
    )
    supervisor = Supervisor([child], poll_interval=0.05)
    first = child.url

    async def scenario() -> None:
        await supervisor.start_all()
        assert child.process is not None and child.process.pid is not None
        watch = asyncio.create_task(supervisor.watch())
        os.kill(child.process.pid, signal.SIGKILL)
        taken = int((first or "").rsplit(":", 1)[1])
        # The stranger binds from this loop's thread, before the watch can run: the restart
        # always finds the port taken.
        with someone_else_on(taken):
            if not moves:
                with pytest.raises(ChildFailed, match="its port was taken"):
                    await asyncio.wait_for(watch, 60)
                return
            await eventually_async(lambda: child.restarts == 1 and child.up, 60, "engine0 back")
            watch.cancel()
            assert child.up and child.url != first and started == [first, child.url]
            # The restarted child answers at its new url, and the stranger still has the old.
            assert child.process is not None
            assert child.process.wait_healthy(child.url or "", timeout=5) is None

    try:
        asyncio.run(scenario())
    finally:
        supervisor.stop_all(timeout=2)
    assert "address already in use" in (tmp_path / "engine0.log").read_text().lower()
