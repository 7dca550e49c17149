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
from pathlib import Path

import psutil

from areal.plugins.launchers.slurm import Placement, SlurmLauncher, SlurmOptions

WRITE = (
    "import os, pathlib, socket; pathlib.Path(os.environ['OUT']).write_text("
    "os.environ['SLURM_JOB_ID'] + '.' + os.environ['SLURM_STEP_ID'] + ' ' + socket.gethostname())"
)
GRACEFUL = (
    "import pathlib, signal, sys, time\n"
    "def stop(signum, frame):\n"
    "    pathlib.Path(sys.argv[1]).write_text(str(signum)); sys.exit(0)\n"
    "signal.signal(signal.SIGINT, stop)\n"
    "time.sleep(120)\n"
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


def wait_for(predicate: object, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():  # type: ignore[operator]
            return time.monotonic() - started
        time.sleep(0.2)
    return -1.0


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
    out["step_seen_s"] = wait_for(lambda: steps_named("rollout0"), 20)
    # The step is listed a moment before its task runs; a SIGTERM in between ends srun cleanly
    # (exit 0, seen once in a loaded full run). The premise is a running child: wait for it.
    out["task_seen_s"] = wait_for(_sleeping, 20)
    sleeper.send_signal(signal.SIGTERM)
    out["sleeper_rc"] = sleeper.wait(timeout=30)
    out["sleep_gone_s"] = wait_for(lambda: not _sleeping(), 20)
    out["sleeper_step_gone_s"] = wait_for(lambda: not steps_named("rollout0"), 20)

    flag = report.with_name("graceful")
    graceful = launcher.wrap(Placement("gateway", "gateway"), [sys.executable, "-c", GRACEFUL])
    child = subprocess.Popen([*graceful, str(flag)])
    wait_for(lambda: steps_named("gateway"), 20)
    time.sleep(1.0)  # the task's signal handler is set
    child.send_signal(signal.SIGINT)
    out["graceful_rc"] = child.wait(timeout=30)
    out["graceful_signal"] = flag.read_text() if flag.exists() else None
    report.write_text(json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
