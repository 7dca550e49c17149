"""Children die with their parent, whatever kills it (areal.host.parent_death), with real processes:
a parent that starts a ServerProcess is killed by a signal that runs none of its exit code, and
its child goes with it; so does a stopped child, and a group under the portable watcher.

Real process trees of sleeping processes, and the kernel's or the watcher's reaction to a death
(waited for as events, so a loaded machine only makes them slower).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from areal.host.parent_death import guarded, pdeathsig_available
from support import eventually

SRC = Path(__file__).resolve().parents[2] / "src"
ENV = {**os.environ, "PYTHONPATH": str(SRC)}
GONE_S = 60.0  # a ceiling for a dead parent's child to go, not a guess at how fast it goes
SLEEPS = "import signal; signal.pause()"  # the server: it lives until it is killed
# A parent that starts one server (a ServerProcess, or the command behind the portable watcher),
# says the server's pid, and lives until it is killed.
PARENT = f"""
import signal, subprocess, sys
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # killed by it even when started under nohup
from areal.host.parent_death import guarded
from areal.host.process import ServerProcess
server = [sys.executable, "-c", {SLEEPS!r}]
if sys.argv[1] == "watch":
    pid = subprocess.Popen(guarded(server, watch=True), start_new_session=True).pid
else:
    pid = ServerProcess(server, log_path=sys.argv[2]).start().pid
print(pid, flush=True)
signal.pause()
"""
needs_pdeathsig = pytest.mark.skipif(
    not pdeathsig_available(), reason="PR_SET_PDEATHSIG is Linux's (the watcher is tested too)"
)


def _gone(pid: int) -> bool:
    """Exited (reaped, or a zombie nobody has reaped yet)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pid: int, what: str) -> None:
    eventually(lambda: _gone(pid), GONE_S, what)


def _sleeping(pid: int) -> bool:
    """The sleep itself runs as ``pid`` or its child (not the wrapper, whose argv holds it)."""
    try:
        proc = psutil.Process(pid)
        return any(p.cmdline()[1:] == ["-c", SLEEPS] for p in [proc, *proc.children()])
    except psutil.Error:
        return False


def _parent(tmp_path: Path, *, watch: bool = False) -> tuple[subprocess.Popen[str], int]:
    args = ["watch" if watch else "plain", str(tmp_path / "server.log")]
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, *args], stdout=subprocess.PIPE, text=True, env=ENV
    )
    assert parent.stdout is not None
    line = parent.stdout.readline()
    assert line.strip().isdigit(), line
    pid = int(line)
    eventually(lambda: _sleeping(pid), GONE_S, f"the server {pid} past its wrapper")
    return parent, pid


def _kill(parent: subprocess.Popen[str], sig: int = signal.SIGKILL) -> None:
    parent.send_signal(sig)
    parent.wait(timeout=GONE_S)


@needs_pdeathsig
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP, signal.SIGSEGV])
def test_a_server_dies_with_a_parent_killed_by_any_signal(tmp_path: Path, sig: int) -> None:
    parent, server = _parent(tmp_path)
    # Past the wrapper's prctl and exec, with its parent alive: the server runs.
    assert not _gone(server), "the server died with its parent still alive"
    assert psutil.Process(server).cmdline()[-1] == SLEEPS  # exec'd: the wrapper is gone
    _kill(parent, sig)
    _wait_gone(server, f"the server's end after its parent was killed by {sig!r}")


@needs_pdeathsig
def test_a_stopped_server_dies_with_its_parent(tmp_path: Path) -> None:
    parent, server = _parent(tmp_path)
    os.kill(server, signal.SIGSTOP)  # a stopped process ignores SIGTERM until it runs again
    _kill(parent)
    _wait_gone(server, "the stopped server's end after its parent was killed")


def test_the_portable_watcher_kills_the_whole_group(tmp_path: Path) -> None:
    parent, wrapper = _parent(tmp_path, watch=True)
    program = psutil.Process(wrapper).children()
    assert len(program) == 1
    _kill(parent)
    _wait_gone(program[0].pid, "the watched program's end after its parent was killed")
    _wait_gone(wrapper, "the watcher's end after its parent was killed")


def test_the_watcher_ends_as_its_command_ended() -> None:
    def code(script: str) -> int:
        command = guarded([sys.executable, "-c", script], watch=True)
        return subprocess.run(command, timeout=60).returncode

    assert code("import sys; sys.exit(3)") == 3
    assert code("import os, signal; os.kill(os.getpid(), signal.SIGTERM)") == -signal.SIGTERM


@needs_pdeathsig
def test_a_parent_gone_before_the_prctl_is_noticed() -> None:
    """The wrapper was told a parent that is not (any longer) its own: it runs nothing."""
    command = guarded([sys.executable, "-c", "print('ran')"])
    command[4] = "1"  # the parent pid the wrapper checks (its real parent is this process)
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "ran" not in done.stdout


def test_a_process_that_watches_its_parent_dies_with_it() -> None:
    """What a torchrun rank does (watch_parent): its parent is not areal's to guard."""
    rank = (
        "import signal; from areal.host.parent_death import watch_parent; "
        "watch_parent(poll_s=0.05); print('watching', flush=True); signal.pause()"
    )
    middle = (
        "import signal, subprocess, sys; "
        f"p = subprocess.Popen([sys.executable, '-c', {rank!r}]); "
        "print(p.pid, flush=True); signal.pause()"
    )
    launcher = subprocess.Popen(
        [sys.executable, "-c", middle], stdout=subprocess.PIPE, text=True, env=ENV
    )
    assert launcher.stdout is not None
    pid = int(launcher.stdout.readline())
    assert launcher.stdout.readline() == "watching\n"  # its watch is running
    assert not _gone(pid)
    _kill(launcher)
    _wait_gone(pid, "the watching rank's end after its parent was killed")
