"""Servers that listen on their node's address (``launcher.listen: node``): the shim a launcher
runs on the node says the address and execs the command with it filled in; the supervisor reads
the announcement from the child's log and health-checks the server there, on a launcher that
places processes (one that places them on this machine, here), and refuses the local launcher."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest

from areal.core.launcher import Placement
from areal.host.on_node import ANNOUNCE, NODE_ADDRESS_ENV, NODE_HOST, node_address, on_node
from areal.host.process import ServerExitedError, ServerProcess, pick_free_port
from areal.run.supervisor import Child, ChildFailed, Supervisor

SHOW = "import os, sys; print(os.getpid(), sys.argv[1], os.environ['AREAL_NODE_ADDRESS'])"

# A /health server on the host and port of its command line, as an engine or the gateway is.
HEALTH_ON = """
import http.server, sys

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass

http.server.HTTPServer((sys.argv[1], int(sys.argv[2])), Health).serve_forever()
"""


def run_shim(command: Sequence[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(on_node(command), env=env, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, f"{proc.pid}\n{out}")


def test_the_shim_says_the_address_and_execs_the_command_with_it() -> None:
    env = {**os.environ, NODE_ADDRESS_ENV: "10.1.2.3"}  # what a Ray actor sets from Ray's node IP
    done = run_shim([sys.executable, "-c", SHOW, f"--host={NODE_HOST}"], env)
    shim_pid, announced, shown = done.stdout.splitlines()
    assert announced == f"{ANNOUNCE}10.1.2.3"
    pid, arg, address = shown.split()
    assert (pid, arg, address) == (shim_pid, "--host=10.1.2.3", "10.1.2.3")  # exec: same pid
    assert done.returncode == 0


def test_without_a_given_address_the_shim_finds_the_routed_one() -> None:
    env = {k: v for k, v in os.environ.items() if k != NODE_ADDRESS_ENV}
    done = run_shim([sys.executable, "-c", "import sys; sys.exit(7)"], env)
    assert done.stdout.splitlines()[1] == f"{ANNOUNCE}{node_address()}"
    assert done.returncode == 7  # the command's exit code, not the shim's


def test_a_command_that_cannot_run_fails_with_its_name() -> None:
    done = subprocess.run(
        on_node(["/nonexistent/server"]), capture_output=True, text=True, timeout=30
    )
    assert done.returncode != 0 and "cannot run /nonexistent/server" in done.stderr


def test_wait_for_line_reads_only_this_starts_output(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    log.write_text(f"{ANNOUNCE}10.9.9.9\n")  # an earlier start's announcement
    said = ANNOUNCE + "10.0.0.5"
    say = [sys.executable, "-c", f"import signal; print({said!r}, flush=True); signal.pause()"]
    process = ServerProcess(say, log_path=log, name="engine0")
    process.start()
    try:
        assert process.wait_for_line(ANNOUNCE, timeout=20) == "10.0.0.5"
    finally:
        process.stop(timeout=2)
    quiet = ServerProcess([sys.executable, "-c", "print('no address')"], log_path=log, name="e0")
    quiet.start()
    with pytest.raises(ServerExitedError, match="before it printed"):
        quiet.wait_for_line(ANNOUNCE, timeout=20)


class OnThisMachine:
    """A launcher that places every process on this machine, as one node of a cluster would."""

    name = "this-machine"

    def wrap(self, placement: Placement, command: Sequence[str]) -> list[str]:
        return list(command)

    def describe(self, placement: Placement) -> str:
        return "here"


def test_the_supervisor_learns_a_placed_servers_url_from_its_node(tmp_path: Path) -> None:
    port = pick_free_port()
    child = Child(
        name="engine0",
        command=lambda: [sys.executable, "-c", HEALTH_ON, NODE_HOST, str(port)],
        log_path=tmp_path / "engine0.log",
        url=f"http://{NODE_HOST}:{port}",
        start_timeout=30,
        placement=Placement("engine0", "engine"),
    )
    supervisor = Supervisor([child], launcher=OnThisMachine())
    try:
        asyncio.run(supervisor.start_all())
        assert child.url == f"http://{node_address()}:{port}"
        assert httpx.get(f"{child.url}/health").status_code == 200
    finally:
        supervisor.stop_all(timeout=2)


def test_the_local_launcher_refuses_a_server_on_its_nodes_address(tmp_path: Path) -> None:
    child = Child(
        name="gateway",
        command=lambda: [sys.executable, "-c", "pass"],
        log_path=tmp_path / "gateway.log",
        url=f"http://{NODE_HOST}:9",
        placement=Placement("gateway", "gateway"),
    )
    supervisor = Supervisor([child])
    with pytest.raises(ChildFailed, match="gateway listens on its node's address"):
        try:
            asyncio.run(supervisor.start_all())
        finally:
            supervisor.stop_all(timeout=2)
