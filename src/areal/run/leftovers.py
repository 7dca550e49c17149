"""``{output_dir}/run/processes.json``: which processes a run is made of, so the next start on the
same output directory can tell whether any of them is still alive.

A leftover of an earlier run (its ``areal train`` still running, or a child that outlived it)
holds the run's files: a gateway appends to the episode journal the resumed run's books are read
from, a rollout worker rewrites its progress file, an engine keeps its share of the cores. Since
children die with ``areal train`` (:mod:`areal.host.parent_death`) this should not happen; if it
does (a run of an older areal, a process started by hand), a start on that directory stops with one
line naming them, rather than killing processes it did not start: whoever started them decides.

Each entry is a pid with its start time, so a pid the OS gave to an unrelated process since is
not mistaken for a leftover.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import psutil

__all__ = ["PROCESSES_FILE", "LeftoverProcesses", "RunProcesses"]

PROCESSES_FILE = "processes.json"
SAME_START_S = 1.0  # start times read twice agree to well within this


class LeftoverProcesses(RuntimeError):
    """Processes of an earlier run on this output directory are still alive."""


class RunProcesses:
    """This run's processes in ``{run_dir}/processes.json``: ``areal train`` itself (written by
    :meth:`claim`) and each child as it (re)starts (:meth:`record`)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / PROCESSES_FILE
        self._entries: dict[str, dict[str, float | int]] = {}
        self._claimed = False

    def alive(self) -> dict[str, int]:
        """The processes the file names that are still running: ``{name: pid}``."""
        try:
            entries = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        found = {}
        for name, entry in entries.items() if isinstance(entries, dict) else ():
            pid, started = _pid_and_start(entry)
            if pid is not None and pid != os.getpid() and _same_process(pid, started):
                found[name] = pid
        return found

    def claim(self) -> None:
        """Stop with :class:`LeftoverProcesses` if a process of an earlier run on this directory
        is alive; else the file names this process only."""
        alive = self.alive()
        if alive:
            named = ", ".join(f"{name} (pid {pid})" for name, pid in alive.items())
            pids = " ".join(str(pid) for pid in alive.values())
            raise LeftoverProcesses(
                f"{self.path.parent.parent} is still in use by processes of an earlier run: "
                f"{named}; they hold its files and ports. Stop them (kill {pids}) and start again"
            )
        self._entries, self._claimed = {}, True
        self.record("areal train", os.getpid())

    def record(self, name: str, pid: int | None) -> None:
        """``name`` is now ``pid`` (a restart replaces the entry)."""
        if pid is None:
            return
        self._entries[name] = {"pid": pid, "started": _start_time(pid) or 0.0}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._entries, indent=1) + "\n")
        tmp.replace(self.path)

    def release(self) -> None:
        """The run stopped its processes: nothing of it is left to find (a file this run did not
        claim, another run's, stays)."""
        if self._claimed:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            self._claimed = False


def _pid_and_start(entry: object) -> tuple[int | None, float]:
    if not isinstance(entry, dict):
        return None, 0.0
    pid, started = entry.get("pid"), entry.get("started", 0.0)
    if not isinstance(pid, int) or not isinstance(started, (int, float)):
        return None, 0.0
    return pid, float(started)


def _start_time(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def _same_process(pid: int, started: float) -> bool:
    """``pid`` runs, is not a zombie, and started when the recorded process did."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return abs(proc.create_time() - started) < SAME_START_S
    except psutil.Error:
        return False
