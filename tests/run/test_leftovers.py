"""A start on an output directory that a process of an earlier run still uses stops with one line
naming it (areal.run.leftovers); a pid the OS has since given to another process is no leftover."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from areal.run.leftovers import PROCESSES_FILE, LeftoverProcesses, RunProcesses
from areal.run.runner import RunError, train
from support.processes import SLEEPER
from support.runs import make_config


@pytest.fixture
def leftover() -> Iterator[subprocess.Popen[bytes]]:
    """A process that outlived its run (started by hand here, as an older areal's would be)."""
    proc = subprocess.Popen(SLEEPER, stdout=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_live_process_of_an_earlier_run_is_named(
    tmp_path: Path, leftover: subprocess.Popen[bytes]
) -> None:
    earlier = RunProcesses(tmp_path / "out" / "run")
    earlier.record("gateway", leftover.pid)
    earlier.record("engine0", 2**22 + 1)  # long gone (beyond any pid the kernel hands out here)

    with pytest.raises(LeftoverProcesses) as caught:
        RunProcesses(tmp_path / "out" / "run").claim()
    message = str(caught.value)
    assert "\n" not in message
    assert f"gateway (pid {leftover.pid})" in message and "engine0" not in message
    assert f"kill {leftover.pid}" in message and str(tmp_path / "out") in message

    leftover.kill()
    leftover.wait()
    again = RunProcesses(tmp_path / "out" / "run")
    again.claim()  # nothing alive: the file now names this process only
    data = json.loads((tmp_path / "out" / "run" / PROCESSES_FILE).read_text())
    assert list(data) == ["areal train"] and data["areal train"]["pid"] == os.getpid()
    again.release()
    assert not (tmp_path / "out" / "run" / PROCESSES_FILE).exists()


def test_a_reused_pid_is_not_a_leftover(tmp_path: Path, leftover: subprocess.Popen[bytes]) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # The pid is alive, but it started long after the process the file meant.
    entry = {"pid": leftover.pid, "started": time.time() - 3600}
    (run_dir / PROCESSES_FILE).write_text(json.dumps({"rollout0": entry}))
    assert RunProcesses(run_dir).alive() == {}


def test_resume_stops_at_once_while_a_leftover_holds_the_run(
    tmp_path: Path, leftover: subprocess.Popen[bytes]
) -> None:
    out = tmp_path / "out"
    RunProcesses(out / "run").record("gateway", leftover.pid)
    config = make_config(tmp_path, train={"max_steps": 1})
    with pytest.raises(RunError, match=rf"gateway \(pid {leftover.pid}\)"):
        train(config, out, resume=True)
    # It stopped before anything else: no engine was started, no checkpoint looked for.
    assert not (tmp_path / "logs" / "engine0.log").exists()
    assert leftover.poll() is None  # not ours to kill: named, left alone
    assert RunProcesses(out / "run").alive() == {"gateway": leftover.pid}  # its file stays

    # A run that fails after its claim (here: nothing to resume) leaves no claim behind either.
    leftover.kill()
    leftover.wait()
    with pytest.raises(RunError, match="no checkpoint"):
        train(config, out, resume=True)
    assert not (out / "run" / PROCESSES_FILE).exists()
