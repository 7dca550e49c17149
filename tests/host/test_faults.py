"""The fault tests' crash points (``areal.host.faults``): which point dies or stops, and when.

In process, the signal a point would send is recorded instead (``os.kill`` replaced): which
points a ``AREAL_TEST_STOP_AT`` list stops, always or only while its file exists. One real child
proves the stop itself: it stops at its point, stays stopped, and goes on at SIGCONT.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from areal.host import faults
from areal.host.faults import CRASH_ENV, STOP_ENV, crash_point, stops_at
from support import eventually

# A child that passes one crash point, then says it went on.
PASSES = "from areal.host.faults import crash_point\ncrash_point('x.point')\nprint('went on')\n"


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The signals crash points send to this process (recorded, not sent)."""
    signals: list[int] = []

    def kill(pid: int, sig: int) -> None:
        assert pid == os.getpid()
        signals.append(sig)

    monkeypatch.setattr(faults.os, "kill", kill)
    monkeypatch.delenv(CRASH_ENV, raising=False)
    monkeypatch.delenv(STOP_ENV, raising=False)
    return signals


def test_unset_a_point_only_goes_on(sent: list[int]) -> None:
    with faults.trace() as reached:
        crash_point("a.point")
        crash_point("b.point")
    assert sent == []
    assert reached == ["a.point", "b.point"]


def test_the_crash_point_named_kills(sent: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CRASH_ENV, "b.point")
    crash_point("a.point")
    assert sent == []
    crash_point("b.point")
    assert sent == [signal.SIGKILL]


def test_every_point_a_stop_list_names_stops(
    sent: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STOP_ENV, "a.point, b.point")
    for name in ("a.point", "c.point", "b.point", "a.point", "a"):
        crash_point(name)
    assert sent == [signal.SIGSTOP] * 3  # a, b, a again: every pass; not c, not a prefix


def test_an_armed_point_stops_only_while_its_file_exists(
    sent: list[int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    armed = tmp_path / "odd@name"  # the path after the first "@" is the file's, "@" and all
    monkeypatch.setenv(STOP_ENV, f"sync.point,episode.point@{armed}")
    crash_point("episode.point")
    assert sent == []  # not armed
    crash_point("sync.point")
    assert sent == [signal.SIGSTOP]  # the other entry stops at every pass
    armed.touch()
    crash_point("episode.point")
    assert sent == [signal.SIGSTOP] * 2
    armed.unlink()
    crash_point("episode.point")
    assert sent == [signal.SIGSTOP] * 2


def test_stops_at_reads_each_entry_on_its_own(tmp_path: Path) -> None:
    armed = tmp_path / "armed"
    armed.touch()
    missing = tmp_path / "missing"
    assert stops_at("p", "p")
    assert stops_at("p", f"q,p@{armed}")
    assert not stops_at("p", f"p@{missing}")
    assert stops_at("p", f"p@{missing},p")  # an unarmed entry leaves an unconditional one
    assert not stops_at("p", "q,pp,")
    assert not stops_at("p", "")


def test_a_process_stops_at_its_armed_point_until_sigcont(tmp_path: Path) -> None:
    armed = tmp_path / "armed"
    armed.touch()
    env = {**os.environ, STOP_ENV: f"x.point@{armed}"}
    env.pop(CRASH_ENV, None)
    child = subprocess.Popen(
        [sys.executable, "-c", PASSES], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        proc = psutil.Process(child.pid)
        eventually(lambda: proc.status() == psutil.STATUS_STOPPED, 30, "the child stopped")
        assert child.poll() is None  # held at the point: it has not gone on
        os.kill(child.pid, signal.SIGCONT)
        out, _ = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0
    assert out == "went on\n"


def test_a_process_passes_its_point_while_unarmed(tmp_path: Path) -> None:
    env = {**os.environ, STOP_ENV: f"x.point@{tmp_path / 'never-armed'}"}
    env.pop(CRASH_ENV, None)
    done = subprocess.run(
        [sys.executable, "-c", PASSES], env=env, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout) == (0, "went on\n"), done.stderr
