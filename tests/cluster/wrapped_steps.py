"""Run inside an sbatch job by test_slurm.py: start children the way the supervisor does, as
local processes of :meth:`SlurmLauncher.wrap`'s command line, and write what happened to
``argv[1]`` (JSON): a ``python -c`` step that writes a file, then a long ``sleep`` step that
is stopped by SIGTERM to its srun, then one stopped gracefully by SIGINT."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the support package

from areal.plugins.launchers.slurm import Placement, SlurmLauncher, SlurmOptions
from support.wait import NeverHappened, eventually

WRITE = (
    "import os, pathlib, socket; pathlib.Path(os.environ['OUT']).write_text("
    "os.environ['SLURM_JOB_ID'] + '.' + os.environ['SLURM_STEP_ID'] + ' ' + socket.gethostname())"
)
GRACEFUL = (
    "import pathlib, signal, sys\n"
    "def stop(signum, frame):\n"
    "    pathlib.Path(sys.argv[1]).write_text(str(signum)); sys.exit(0)\n"
    "signal.signal(signal.SIGINT, stop)\n"
    "pathlib.Path(sys.argv[1] + '.ready').touch()\n"
    "signal.pause()\n"
)


def steps_named(name: str) -> list[str]:
    out = subprocess.run(
        ["squeue", "--steps", "--noheader", "--format=%i %j"], capture_output=True, text=True
    ).stdout
    return [line.split()[0] for line in out.splitlines() if line.split()[1:] == [name]]


def _sleeping() -> bool:
    """Is the wrapped task (``/usr/bin/sleep 377``, as slurmstepd runs it) running? Not the srun
    whose command line ends with the same two words: it is listed from the start."""
    return any(
        Path((p.info["cmdline"] or ["?"])[0]).name == "sleep" and p.info["cmdline"][1:] == ["377"]
        for p in psutil.process_iter(["cmdline"])
    )


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> float:
    """Seconds until ``predicate`` held; -1 if it never did (the test reads the report)."""
    started = time.monotonic()
    try:
        eventually(predicate, timeout, what)
    except NeverHappened:
        return -1.0
    return time.monotonic() - started


def main(report: Path) -> None:
    launcher = SlurmLauncher(SlurmOptions())
    out: dict[str, object] = {}
    engine = Placement("engine0", "engine")
    command = launcher.wrap(engine, [sys.executable, "-c", WRITE])
    out["wrapped"] = command
    written = report.with_name("written")
    env = {**os.environ, "OUT": str(written)}
    out["write_rc"] = subprocess.run(command, env=env, timeout=60).returncode
    out["written"] = written.read_text() if written.exists() else None

    sleeper = subprocess.Popen(launcher.wrap(Placement("rollout0", "rollout"), ["sleep", "377"]))
    out["step_seen_s"] = wait_for(lambda: steps_named("rollout0"), 60, "the step listed")
    # The step is listed before its task runs, and a SIGTERM in between ends srun cleanly (exit
    # 0): the premise is a running child, so the signal waits for the task itself.
    out["task_seen_s"] = wait_for(_sleeping, 60, "the task running")
    sleeper.send_signal(signal.SIGTERM)
    out["sleeper_rc"] = sleeper.wait(timeout=30)
    out["sleep_gone_s"] = wait_for(lambda: not _sleeping(), 60, "the task gone")
    out["sleeper_step_gone_s"] = wait_for(lambda: not steps_named("rollout0"), 60, "step gone")

    flag = report.with_name("graceful")
    graceful = launcher.wrap(Placement("gateway", "gateway"), [sys.executable, "-c", GRACEFUL])
    child = subprocess.Popen([*graceful, str(flag)])
    ready = flag.with_name(flag.name + ".ready")
    out["handler_set_s"] = wait_for(ready.exists, 60, "the task's SIGINT handler set")
    child.send_signal(signal.SIGINT)
    out["graceful_rc"] = child.wait(timeout=30)
    out["graceful_signal"] = flag.read_text() if flag.exists() else None
    report.write_text(json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
