"""Why a gateway cannot be reached: each cause is staged for real on 127.0.0.1 (a free port, a
foreign HTTP server, a socket that never answers, a gateway process still starting, a healthy
server) and the message must name it, with the fix and the log."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from areal.run.reachability import describe_unreachable
from support import eventually
from support.processes import serve


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def foreign_server() -> Iterator[int]:
    yield from serve(404, b"<html>not here</html>")


@pytest.fixture
def healthy_gateway() -> Iterator[int]:
    yield from serve(200, b'{"status": "ok"}')


def test_nothing_listening_says_so_and_quotes_the_log(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "gateway.out"
    log.write_text("starting\nOSError: [Errno 98] address already in use\n")
    message = describe_unreachable(f"http://127.0.0.1:{port}", log_path=log)
    assert message.startswith(f"nothing listens on 127.0.0.1:{port}")
    assert f"areal serve gateway --port {port}" in message
    assert f"its log: {log}" in message and "address already in use" in message


def test_a_missing_log_is_named() -> None:
    message = describe_unreachable(f"http://127.0.0.1:{free_port()}", log_path="/nope/gw.out")
    assert "its log /nope/gw.out does not exist" in message


def test_another_server_on_the_port_is_named_with_its_pid(foreign_server: int) -> None:
    message = describe_unreachable(f"http://127.0.0.1:{foreign_server}")
    assert message.startswith(f"another process holds port {foreign_server}: pid {os.getpid()}")
    assert "not an areal gateway (GET /health answered HTTP 404)" in message


def test_a_socket_that_does_not_answer_http_yet() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()  # accepted by the kernel, never read: no HTTP answer
        port = sock.getsockname()[1]
        message = describe_unreachable(f"http://127.0.0.1:{port}")
    assert f"pid {os.getpid()}" in message and "does not answer HTTP yet" in message


def test_a_gateway_process_that_has_not_bound_its_port_is_starting() -> None:
    port = free_port()
    cmd = [sys.executable, "-c", "import signal; signal.pause()", "areal", "serve", "gateway"]
    proc = subprocess.Popen([*cmd, "--port", str(port)])
    try:
        # Its command line is the gateway's once the interpreter has been exec'd.
        eventually(lambda: "gateway" in psutil.Process(proc.pid).cmdline(), 60, "the exec")
        message = describe_unreachable(f"http://127.0.0.1:{port}")
    finally:
        proc.kill()
        proc.wait()
    assert "the gateway is still starting" in message and f"pid {proc.pid}" in message


def test_only_gateway_commands_for_that_port_count_as_starting() -> None:
    from areal.run.reachability import is_gateway_command

    assert is_gateway_command(["areal", "serve", "gateway", "--port", "9000"], 9000)
    assert is_gateway_command(["python", "-m", "areal.gateway.server", "--port=9000"], 9000)
    assert not is_gateway_command(["areal", "serve", "gateway", "--port", "9001"], 9000)
    assert not is_gateway_command(["areal", "probe", "x:y", "--gateway", "http://h:9000"], 9000)


def test_a_healthy_gateway_is_recognised(healthy_gateway: int) -> None:
    message = describe_unreachable(f"http://127.0.0.1:{healthy_gateway}")
    assert "answers /health now" in message
