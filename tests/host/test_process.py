"""ServerProcess with real subprocesses: a tiny http.server answering /health, and ones that fail.

Its time rules (the health wait's timeout and polls, the stop's grace before SIGKILL, a failed
trainer node's grace) are proved with a clock that moves only when the rule sleeps; the one
wall-clock run of each wait is :func:`test_start_wait_healthy_stop` and the trainer node test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from areal.host import process
from areal.host.clock import SYSTEM_CLOCK
from areal.host.ports import group_listens_on
from areal.host.process import (
    STOP_POLL_S,
    PortTakenError,
    ServerExitedError,
    ServerProcess,
    pick_free_port,
    start_on_free_port,
    wait_passing_on_stops,
)
from support import eventually
from support.clock import SleepingClock
from support.processes import HEALTH_SERVER, SLEEPER, children, serve

# A HEALTH_SERVER that binds only when the test opens its gate (a FIFO, the last argument): a
# test that holds the port first decides when the server tries it.
GATED = "import sys\nopen(sys.argv.pop()).read()\n"
# Says it is ready, then lives until it is killed: SIGTERM (or SIGINT, the trainer's stop) is
# ignored, as by a server that hangs.
IGNORES = (
    "import signal\nsignal.signal(signal.SIG{}, signal.SIG_IGN)\n"
    "print('ready', flush=True)\nsignal.pause()\n"
)


class Gate:
    """The gate of a GATED server, and a clock that opens it at the health wait's first sleep:
    by then the wait has looked once (and found whoever answers on the port), and it looks again
    only once the gated server has tried to bind and exited. Otherwise the real clock."""

    def __init__(self, tmp_path: Path) -> None:
        self.path = tmp_path / "gate"
        os.mkfifo(self.path)
        self.opened = False

    def command(self, port: int) -> list[str]:
        return [sys.executable, "-c", GATED + HEALTH_SERVER, str(port), str(self.path)]

    def monotonic(self) -> float:
        return SYSTEM_CLOCK.monotonic()

    def sleep(self, seconds: float, /) -> None:
        if not self.opened:
            self.opened = eventually(self._open, 60, "the gated server at its gate") == "opened"
            if self.opened:
                eventually(lambda: not children(str(self.path)), 60, "the gated server's exit")
        SYSTEM_CLOCK.sleep(seconds)

    def _open(self) -> str:
        if not children(str(self.path)):
            return "gone"  # stopped at the gate (the sleeps of a stop after a failed wait)
        # A writer's open succeeds once the server holds the FIFO open; its close is the EOF the
        # server waits for.
        os.close(os.open(self.path, os.O_WRONLY | os.O_NONBLOCK))
        return "opened"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); read its state where /proc exists.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ")[-1].startswith("Z"))


def _child_pid(log: Path) -> int:
    def said() -> int | None:
        lines = log.read_text().splitlines()
        return next((int(line.split()[1]) for line in lines if line.startswith("child ")), None)

    return eventually(said, 60, f"the server's 'child PID' line in {log}")


@contextlib.contextmanager
def someone_else_answering_health() -> Iterator[int]:
    """Another process's server on a port (the test's own process: not the server's group),
    answering 200 on every path, as another run's gateway or engine would on ``/health``."""
    yield from serve(200, b"")


def test_pick_free_port_is_bindable() -> None:
    port = pick_free_port()
    assert 0 < port < 65536
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_start_wait_healthy_stop(tmp_path: Path) -> None:
    port = pick_free_port()
    log = tmp_path / "logs" / "server.log"
    server = ServerProcess(
        [sys.executable, "-c", HEALTH_SERVER, str(port)], log_path=log, env={"AREAL_TEST": "1"}
    )
    with server:
        url = f"http://127.0.0.1:{port}"
        server.wait_healthy(url, timeout=60)
        assert server.running and server.url == url
        assert httpx.get(f"{url}/health", trust_env=False).status_code == 200
        child = _child_pid(log)
        assert _alive(child)
        leader = server.pid
        assert leader is not None and os.getpgid(leader) == leader  # its own process group
    assert not server.running and server.returncode is not None
    assert not _alive(child), "the forked worker outlived stop()"
    assert "serving on" in log.read_text()


def test_env_reaches_the_process(tmp_path: Path) -> None:
    """A process that exits while the health wait runs (on the real clock) fails the wait."""
    log = tmp_path / "env.log"
    server = ServerProcess(
        [sys.executable, "-c", "import os; print(os.environ['AREAL_MARK'])"],
        log_path=log,
        env={"AREAL_MARK": "mark-42"},
    ).start()
    with pytest.raises(ServerExitedError):
        server.wait_healthy(f"http://127.0.0.1:{pick_free_port()}", timeout=60)
    server.stop()
    assert "mark-42" in log.read_text()


def test_early_exit_fails_fast_with_the_log_tail(tmp_path: Path) -> None:
    """A server that has exited fails the health wait at its first look, with no time passed."""
    script = "import sys\nfor i in range(100): print(f'line {i}')\nsys.exit(3)"
    log = tmp_path / "crash.log"
    clock = SleepingClock()
    server = ServerProcess(
        [sys.executable, "-c", script], log_path=log, name="crashy", clock=clock
    ).start()
    eventually(lambda: server.returncode is not None, 60, "the crashing server's exit")
    with pytest.raises(ServerExitedError) as info:
        server.wait_healthy(f"http://127.0.0.1:{pick_free_port()}", timeout=60)
    assert clock.slept == []
    message = str(info.value)
    assert "crashy" in message and "exited with code 3" in message
    assert str(log) in message and "line 99" in message and "line 60" in message
    assert "line 59\n" not in message  # only the last 40 lines
    assert server.stop() == 3


def test_timeout_names_the_url_and_shows_the_log(tmp_path: Path) -> None:
    """The health wait polls every ``interval`` and gives up after ``timeout``, to the poll."""
    log = tmp_path / "slow.log"
    script = "import signal\nprint('loading weights', flush=True)\nsignal.pause()"
    url = f"http://127.0.0.1:{pick_free_port()}"
    clock = SleepingClock()
    with ServerProcess([sys.executable, "-c", script], log_path=log, clock=clock) as server:
        eventually(lambda: "loading weights" in log.read_text(), 60, "the server's first line")
        with pytest.raises(TimeoutError) as info:
            server.wait_healthy(url, timeout=1.0, interval=0.25)
        assert clock.slept == [0.25] * 4 and clock.elapsed == 1.0  # looked at 0, ¼, ½, ¾ and 1 s
    assert f"{url}/health" in str(info.value) and "loading weights" in str(info.value)
    assert not server.running


def test_stop_kills_a_process_that_ignores_sigterm(tmp_path: Path) -> None:
    """SIGTERM first; what is still there after ``timeout`` is SIGKILLed, at that very poll."""
    log = tmp_path / "stubborn.log"
    clock = SleepingClock()
    command = [sys.executable, "-c", IGNORES.format("TERM")]
    server = ServerProcess(command, log_path=log, clock=clock).start()
    eventually(lambda: "ready" in log.read_text(), 60, "the stubborn server's 'ready'")
    assert server.stop(timeout=10.0) == -signal.SIGKILL
    assert 10.0 <= clock.elapsed < 10.0 + STOP_POLL_S
    assert set(clock.slept) == {STOP_POLL_S}


def test_missing_executable_raises_and_cannot_start_twice(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        ServerProcess(["/no/such/binary"], log_path=tmp_path / "x.log").start()
    with pytest.raises(ValueError, match="non-empty"):
        ServerProcess([], log_path=tmp_path / "y.log")
    server = ServerProcess([sys.executable, "-c", "pass"], log_path=tmp_path / "z.log").start()
    with pytest.raises(RuntimeError, match="already started"):
        server.start()
    server.stop()


def _ready(command: list[str], log: Path, popen: type[subprocess.Popen[bytes]]) -> Any:
    """``command`` started with its output in ``log``, once it has said 'ready'."""
    with log.open("w") as out:
        proc = popen([sys.executable, "-c", *command], stdout=out)
    eventually(lambda: log.read_text().startswith("ready"), 60, f"'ready' in {log}")
    return proc


def test_one_failed_trainer_node_stops_the_others_and_its_code_is_returned(tmp_path: Path) -> None:
    """A trainer over several nodes: the node that fails first names the exit code, and the
    ones still running get the graceful stop (SIGINT) instead of waiting for their peers."""
    waits = (
        "import signal, sys\n"
        "signal.signal(signal.SIGINT, lambda *a: (print('stopped', flush=True), sys.exit(0)))\n"
        "print('ready', flush=True)\n"
        "signal.pause()\n"
    )
    log = tmp_path / "waiting.log"
    waiting = _ready([waits], log, subprocess.Popen)
    failing = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert wait_passing_on_stops(waiting, failing, interval=0.05) == (3, False)
    assert waiting.returncode == 0 and log.read_text() == "ready\nstopped\n"


def test_a_node_that_ignores_the_stop_is_killed_after_the_grace(tmp_path: Path) -> None:
    clock = SleepingClock()
    signals: list[tuple[int, float]] = []

    class Node(subprocess.Popen[bytes]):
        def send_signal(self, sig: int) -> None:
            signals.append((sig, clock.now()))
            super().send_signal(sig)

    waiting = _ready([IGNORES.format("INT")], tmp_path / "deaf.log", Node)
    failing = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert wait_passing_on_stops(waiting, failing, grace=60.0, interval=0.5, clock=clock) == (
        3,
        False,
    )
    assert waiting.returncode == -signal.SIGKILL
    (asked, stop_at), (killed, kill_at), *_ = signals
    assert (asked, killed) == (signal.SIGINT, signal.SIGKILL)
    assert kill_at - stop_at == 60.5  # the first poll past the grace


def test_a_200_from_another_process_on_the_port_is_not_the_servers_health(tmp_path: Path) -> None:
    """The port race: the server's port was picked free, another process bound it first. Its
    ``/health`` answers 200 while the server is still starting; that is not the server's
    answer, and the server's exit on the taken port says so."""
    gate = Gate(tmp_path)
    with someone_else_answering_health() as port:
        log = tmp_path / "server.log"
        server = ServerProcess(gate.command(port), log_path=log, clock=gate).start()
        try:
            with pytest.raises(PortTakenError, match="its port was taken"):
                server.wait_healthy(f"http://127.0.0.1:{port}", timeout=60)
        finally:
            server.stop()
    assert gate.opened  # the wait had seen the other process's 200 before the server tried
    assert "Address already in use" in log.read_text()


def test_start_on_free_port_starts_again_on_another_port_when_its_port_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pick = process.pick_free_port
    gate = Gate(tmp_path)
    with someone_else_answering_health() as taken:
        picks = iter([taken])
        monkeypatch.setattr(process, "pick_free_port", lambda host: next(picks, 0) or pick(host))
        log = tmp_path / "server.log"

        def command(port: int) -> list[str]:
            if port == taken:  # the first try: it binds once the wait has seen the other's 200
                return gate.command(port)
            return [sys.executable, "-c", HEALTH_SERVER, str(port)]

        server = start_on_free_port(command, log_path=log, timeout=60, clock=gate)
        with server:
            assert server.url is not None and not server.url.endswith(f":{taken}")
            assert httpx.get(f"{server.url}/health", trust_env=False).status_code == 200
        assert gate.opened
        assert log.read_text().count("Address already in use") == 1  # the first try's

        monkeypatch.setattr(process, "pick_free_port", lambda host: taken)
        with pytest.raises(PortTakenError):  # every port tried was taken: it says so
            start_on_free_port(
                lambda port: [sys.executable, "-c", HEALTH_SERVER, str(port)],
                log_path=tmp_path / "again.log",
                timeout=60,
                tries=2,
            )
    assert (tmp_path / "again.log").read_text().count("Address already in use") == 2


def test_group_listens_on_tells_whose_listener_it_is(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = int(sock.getsockname()[1])
        assert group_listens_on(port, os.getpgrp()) is True
        with ServerProcess(SLEEPER, log_path=tmp_path / "o.log") as other:
            assert other.pid is not None
            assert group_listens_on(port, other.pid) is False  # its own group holds no listener
    assert group_listens_on(port, os.getpgrp()) is False  # closed: nobody listens there
