"""ServerProcess with real subprocesses: a tiny http.server answering /health, and ones that fail."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.run.test_reachability import serve

from areal.host import process
from areal.host.ports import group_listens_on
from areal.host.process import (
    PortTakenError,
    ServerExitedError,
    ServerProcess,
    pick_free_port,
    start_on_free_port,
)

# A health-only server; it also forks a child into its process group, as SGLang does, so stop()
# must take the whole group down.
HEALTH_SERVER = """
import http.server, os, subprocess, sys, time
port = int(sys.argv[1])
time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0)  # a server that takes its time to bind
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(f"child {child.pid}", flush=True)

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass

print(f"serving on {port}", flush=True)
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); read its state where /proc exists.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ")[-1].startswith("Z"))


def _child_pid(log: Path) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if line.startswith("child "):
                return int(line.split()[1])
        time.sleep(0.05)
    raise AssertionError(f"no child pid in {log}")


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
        server.wait_healthy(url, timeout=20)
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
    log = tmp_path / "env.log"
    server = ServerProcess(
        [sys.executable, "-c", "import os; print(os.environ['AREAL_MARK'])"],
        log_path=log,
        env={"AREAL_MARK": "mark-42"},
    ).start()
    with pytest.raises(ServerExitedError):
        server.wait_healthy(f"http://127.0.0.1:{pick_free_port()}", timeout=20)
    server.stop()
    assert "mark-42" in log.read_text()


def test_early_exit_fails_fast_with_the_log_tail(tmp_path: Path) -> None:
    script = "import sys\nfor i in range(100): print(f'line {i}')\nsys.exit(3)"
    log = tmp_path / "crash.log"
    server = ServerProcess([sys.executable, "-c", script], log_path=log, name="crashy").start()
    started = time.monotonic()
    with pytest.raises(ServerExitedError) as info:
        server.wait_healthy(f"http://127.0.0.1:{pick_free_port()}", timeout=60)
    assert time.monotonic() - started < 20
    message = str(info.value)
    assert "crashy" in message and "exited with code 3" in message
    assert str(log) in message and "line 99" in message and "line 60" in message
    assert "line 59\n" not in message  # only the last 40 lines
    assert server.stop() == 3


def test_timeout_names_the_url_and_shows_the_log(tmp_path: Path) -> None:
    log = tmp_path / "slow.log"
    script = "import time\nprint('loading weights', flush=True)\ntime.sleep(600)"
    url = f"http://127.0.0.1:{pick_free_port()}"
    with ServerProcess([sys.executable, "-c", script], log_path=log) as server:
        time.sleep(0.3)
        with pytest.raises(TimeoutError) as info:
            server.wait_healthy(url, timeout=1.0, interval=0.1)
    assert f"{url}/health" in str(info.value) and "loading weights" in str(info.value)
    assert not server.running


def test_stop_kills_a_process_that_ignores_sigterm(tmp_path: Path) -> None:
    script = (
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\ntime.sleep(600)"
    )
    log = tmp_path / "stubborn.log"
    server = ServerProcess([sys.executable, "-c", script], log_path=log).start()
    deadline = time.monotonic() + 10
    while "ready" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    code = server.stop(timeout=0.5)
    assert code is not None and code < 0  # killed by a signal
    assert time.monotonic() - started < 5


def test_missing_executable_raises_and_cannot_start_twice(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        ServerProcess(["/no/such/binary"], log_path=tmp_path / "x.log").start()
    with pytest.raises(ValueError, match="non-empty"):
        ServerProcess([], log_path=tmp_path / "y.log")
    server = ServerProcess([sys.executable, "-c", "pass"], log_path=tmp_path / "z.log").start()
    with pytest.raises(RuntimeError, match="already started"):
        server.start()
    server.stop()


def test_one_failed_trainer_node_stops_the_others_and_its_code_is_returned(tmp_path: Path) -> None:
    """A trainer over several nodes: the node that fails first names the exit code, and the
    ones still running get the graceful stop (SIGINT) instead of waiting for their peers."""
    import subprocess

    from areal.host.process import wait_passing_on_stops

    waits = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGINT, lambda *a: (print('stopped', flush=True), sys.exit(0)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    log = tmp_path / "waiting.log"
    with log.open("w") as out:
        waiting = subprocess.Popen([sys.executable, "-c", waits], stdout=out)
        deadline = time.monotonic() + 30
        while "ready" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        failing = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
        assert wait_passing_on_stops(waiting, failing, interval=0.05) == (3, False)
    assert waiting.returncode == 0 and log.read_text() == "ready\nstopped\n"


def test_a_200_from_another_process_on_the_port_is_not_the_servers_health(tmp_path: Path) -> None:
    """The port race: the server's port was picked free, another process bound it first. Its
    ``/health`` answers 200 while the server is still starting; that is not the server's
    answer, and the server's exit on the taken port says so."""
    with someone_else_answering_health() as port:
        log = tmp_path / "server.log"
        server = ServerProcess([sys.executable, "-c", HEALTH_SERVER, str(port), "1"], log_path=log)
        server.start()
        try:
            with pytest.raises(PortTakenError, match="its port was taken"):
                server.wait_healthy(f"http://127.0.0.1:{port}", timeout=20)
        finally:
            server.stop()
    assert "Address already in use" in log.read_text()


def test_start_on_free_port_starts_again_on_another_port_when_its_port_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pick = process.pick_free_port
    with someone_else_answering_health() as taken:
        picks = iter([taken])
        monkeypatch.setattr(process, "pick_free_port", lambda host: next(picks, 0) or pick(host))
        log = tmp_path / "server.log"
        server = start_on_free_port(
            lambda port: [sys.executable, "-c", HEALTH_SERVER, str(port), "0.5"],
            log_path=log,
            timeout=20,
        )
        with server:
            assert server.url is not None and not server.url.endswith(f":{taken}")
            assert httpx.get(f"{server.url}/health", trust_env=False).status_code == 200
        assert log.read_text().count("Address already in use") == 1  # the first try's

        monkeypatch.setattr(process, "pick_free_port", lambda host: taken)
        with pytest.raises(PortTakenError):  # every port tried was taken: it says so
            start_on_free_port(
                lambda port: [sys.executable, "-c", HEALTH_SERVER, str(port)],
                log_path=tmp_path / "again.log",
                timeout=20,
                tries=2,
            )
    assert (tmp_path / "again.log").read_text().count("Address already in use") == 2


def test_group_listens_on_tells_whose_listener_it_is(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = int(sock.getsockname()[1])
        assert group_listens_on(port, os.getpgrp()) is True
        other = ServerProcess(
            [sys.executable, "-c", "import time; time.sleep(30)"], log_path=tmp_path / "o.log"
        )
        with other:
            assert other.pid is not None
            assert group_listens_on(port, other.pid) is False  # its own group holds no listener
    assert group_listens_on(port, os.getpgrp()) is False  # closed: nobody listens there
