"""Peak memory of a process tree, sampled from /proc: every process's peak RSS and PSS, and the
peaks of their sums. Used by ``bench/memory.py`` on the processes of a run.

Why both: RSS counts the shared libraries' pages (torch's are large) once per process, so the
sum of RSS overstates what the machine gives the run; PSS splits each shared page between its
sharers and sums to the real figure. ``VmHWM`` is the kernel's own peak RSS of a process, so a
spike between two samples still counts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

MiB = 2**20


def _status_kib(pid: int, key: str) -> int | None:
    """A ``kB`` line of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``), or None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _pss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


@dataclass
class ProcessPeak:
    """What was seen of one process."""

    pid: int
    label: str
    cmdline: str
    peak_rss: int = 0  # bytes: max of VmHWM (the kernel's peak) and the sampled VmRSS
    peak_pss: int = 0  # bytes, sampled
    last_rss: int = 0


@dataclass
class TreeSampler:
    """Samples ``root`` and all its descendants every ``interval`` seconds, in a thread."""

    root: int
    label_of: Callable[[psutil.Process, bool], str]  # (process, is the root) -> a label
    interval: float = 0.5
    window: float = 60.0  # the timeline's step: each label's largest RSS per window
    processes: dict[int, ProcessPeak] = field(default_factory=dict)
    peak_total_rss: int = 0
    peak_total_pss: int = 0
    samples: int = 0
    timeline: dict[str, list[int]] = field(default_factory=dict)  # label -> bytes per window
    _t0: float = field(default_factory=time.monotonic)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> TreeSampler:
        self._thread = threading.Thread(target=self._run, name="tree-memory", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def sample(self) -> None:
        """One look at every process of the tree."""
        try:
            root = psutil.Process(self.root)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        total_rss = total_pss = 0
        for proc in tree:
            rss, hwm, pss = (
                _status_kib(proc.pid, "VmRSS"),
                _status_kib(proc.pid, "VmHWM"),
                _pss_kib(proc.pid),
            )
            if rss is None:
                continue
            try:  # read each time: a child seen between fork and exec has its parent's
                cmdline = " ".join(proc.cmdline())
                label = self.label_of(proc, proc.pid == self.root)
            except psutil.Error:
                continue
            peak = self.processes.get(proc.pid)
            if peak is None:
                peak = self.processes[proc.pid] = ProcessPeak(proc.pid, label, cmdline)
            peak.label, peak.cmdline = label, cmdline
            peak.last_rss = rss * 1024
            peak.peak_rss = max(peak.peak_rss, rss * 1024, (hwm or 0) * 1024)
            peak.peak_pss = max(peak.peak_pss, (pss or 0) * 1024)
            total_rss += rss * 1024
            slot = int((time.monotonic() - self._t0) // self.window)
            line = self.timeline.setdefault(peak.label, [])
            line.extend([0] * (slot + 1 - len(line)))
            line[slot] = max(line[slot], rss * 1024)
            total_pss += (pss or 0) * 1024
        self.peak_total_rss = max(self.peak_total_rss, total_rss)
        self.peak_total_pss = max(self.peak_total_pss, total_pss)
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.sample()
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def report(self) -> dict[str, Any]:
        """Per process (largest first) and the totals, in MiB."""
        rows = sorted(self.processes.values(), key=lambda p: -p.peak_rss)
        return {
            "processes": [
                {
                    "label": p.label,
                    "peak_rss_mib": round(p.peak_rss / MiB, 1),
                    "peak_pss_mib": round(p.peak_pss / MiB, 1),
                    "cmdline": p.cmdline[:200],
                }
                for p in rows
            ],
            "sum_of_peak_rss_mib": round(sum(p.peak_rss for p in rows) / MiB, 1),
            "peak_of_total_rss_mib": round(self.peak_total_rss / MiB, 1),
            "peak_of_total_pss_mib": round(self.peak_total_pss / MiB, 1),
            "timeline_mib": {
                label: [round(b / MiB) for b in line] for label, line in self.timeline.items()
            },
            "timeline_window_s": self.window,
            "samples": self.samples,
            "interval_s": self.interval,
        }
