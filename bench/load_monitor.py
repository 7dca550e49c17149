"""The CPU other people's processes use while a benchmark runs: this box is shared, so each
figure is reported with the load beside it (``bench/async_vs_sync.py``, ``bench/elastic_engines.py``).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import psutil

BUSY_CORES = 0.25  # other load (in cores) above which a figure is flagged as disturbed


class LoadMonitor(threading.Thread):
    """CPU used by processes outside this process tree, per phase, in cores (0 = quiet)."""

    def __init__(self, interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.phase = ""
        self.busy: dict[str, list[float]] = defaultdict(list)
        self._stop_event = threading.Event()

    @contextmanager
    def measuring(self, phase: str) -> Iterator[None]:
        self.phase = phase
        try:
            yield
        finally:
            self.phase = ""

    def other_cores(self, phase: str) -> float:
        samples = self.busy.get(phase) or [0.0]
        return statistics.mean(samples)

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        me = psutil.Process()
        seen: dict[int, float] = {}
        last_busy, last_time = _busy_seconds(), time.monotonic()
        while not self._stop_event.wait(self.interval):
            mine = 0.0
            for proc in [me, *me.children(recursive=True)]:
                try:
                    t = proc.cpu_times()
                except psutil.Error:
                    continue
                total = t.user + t.system
                mine += total - seen.get(proc.pid, 0.0)
                seen[proc.pid] = total
            busy, now = _busy_seconds(), time.monotonic()
            if self.phase:
                other = (busy - last_busy - mine) / (now - last_time)
                self.busy[self.phase].append(max(0.0, other))
            last_busy, last_time = busy, now


def _busy_seconds() -> float:
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)
