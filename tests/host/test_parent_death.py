"""Children die with their parent, whatever kills it (areal.host.parent_death), with real processes:
a parent that starts a ServerProcess is killed by a signal that runs none of its exit code, and
its child is gone within a second or two; so is a stopped child, and a group under the portable
watcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from areal.host.parent_death import guarded, pdeathsig_available

SRC = Path(__file__).resolve().parents[2] / "src"
# A parent that starts one server (a ServerProcess, or the command behind the portable watcher)
# and sleeps; it says the server's pid.
PARENT = """
import signal, subprocess, sys, time
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # killed by it even when started under nohup
from areal.host.parent_death import guarded
from areal.host.process import ServerProcess
server = [sys.executable, "-c", "import time; time.sleep(600)"]
if sys.argv[1] == "watch":
    pid = subprocess.Popen(guarded(server, watch=True), start_new_session=True).pid
else:
    pid = ServerProcess(server, log_path=sys.argv[2]).start().pid
print(pid, flush=True)
time.sleep(600)
"""


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True  # exited; nobody reaped it yet
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def _parent(tmp_path: Path, *, watch: bool = False) -> tuple[subprocess.Popen[str], int]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    args = ["watch" if watch else "plain", str(tmp_path / "server.log")]
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, *args], stdout=subprocess.PIPE, text=True, env=env
    )
    assert parent.stdout is not None
    line = parent.stdout.readline()
    assert line.strip().isdigit(), line
    pid = int(line)
    deadline = time.monotonic() + 10  # past the wrapper: the sleep runs (exec'd, or its child)
    while time.monotonic() < deadline and not _sleeping(pid):
        time.sleep(0.02)
    return parent, pid


SLEEPS = "import time; time.sleep(600)"


def _sleeping(pid: int) -> bool:
    """The sleep itself runs as ``pid`` or its child (not the wrapper, whose argv holds it)."""
    try:
        proc = psutil.Process(pid)
        return any(p.cmdline()[1:] == ["-c", SLEEPS] for p in [proc, *proc.children()])
    except psutil.Error:
        return False


@pytest.mark.skipif(not pdeathsig_available(), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP, signal.SIGSEGV])
def test_a_server_dies_with_a_parent_killed_by_any_signal(tmp_path: Path, sig: int) -> None:
    parent, server = _parent(tmp_path)
    assert not _gone(server, within=0.2), "the server died with its parent still alive"
    assert psutil.Process(server).cmdline()[-1] == "import time; time.sleep(600)"  # exec'd
    parent.send_signal(sig)
    parent.wait(timeout=10)
    assert _gone(server, within=2.0), f"the server outlived a parent killed by {sig!r}"


@pytest.mark.skipif(not pdeathsig_available(), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_stopped_server_dies_with_its_parent(tmp_path: Path) -> None:
    parent, server = _parent(tmp_path)
    os.kill(server, signal.SIGSTOP)  # a stopped process ignores SIGTERM until it runs again
    parent.kill()
    parent.wait(timeout=10)
    assert _gone(server, within=2.0)


def test_the_portable_watcher_kills_the_whole_group(tmp_path: Path) -> None:
    parent, wrapper = _parent(tmp_path, watch=True)
    program = psutil.Process(wrapper).children()
    assert len(program) == 1
    parent.kill()
    parent.wait(timeout=10)
    assert _gone(program[0].pid, within=3.0) and _gone(wrapper, within=3.0)


def test_the_watcher_ends_as_its_command_ended() -> None:
    def code(script: str) -> int:
        command = guarded([sys.executable, "-c", script], watch=True)
        return subprocess.run(command, timeout=30).returncode

    assert code("import sys; sys.exit(3)") == 3
    assert code("import os, signal; os.kill(os.getpid(), signal.SIGTERM)") == -signal.SIGTERM


@pytest.mark.skipif(not pdeathsig_available(), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_parent_gone_before_the_prctl_is_noticed() -> None:
    """The wrapper was told a parent that is not (any longer) its own: it runs nothing."""
    command = guarded([sys.executable, "-c", "print('ran')"])
    command[4] = "1"  # the parent pid the wrapper checks (its real parent is this process)
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and "ran" not in done.stdout


def test_a_process_that_watches_its_parent_dies_with_it(tmp_path: Path) -> None:
    """What a torchrun rank does (watch_parent): its parent is not areal's to guard."""
    rank = (
        "import time; from areal.host.parent_death import watch_parent; "
        "watch_parent(poll_s=0.05); time.sleep(600)"
    )
    middle = (
        "import subprocess, sys, time; "
        f"p = subprocess.Popen([sys.executable, '-c', {rank!r}]); "
        "print(p.pid, flush=True); time.sleep(600)"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    launcher = subprocess.Popen(
        [sys.executable, "-c", middle], stdout=subprocess.PIPE, text=True, env=env
    )
    assert launcher.stdout is not None
    pid = int(launcher.stdout.readline())
    time.sleep(1.0)  # its interpreter and the watch are up
    assert not _gone(pid, within=0.1)
    launcher.kill()
    launcher.wait(timeout=10)
    assert _gone(pid, within=3.0)
