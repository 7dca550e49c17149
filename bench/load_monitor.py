"""The CPU other people's processes use while a benchmark runs: this box is shared, so each
figure is reported with the load beside it (``bench/async_vs_sync.py``, ``bench/elastic_engines.py``).
"""

from __future__ import annotations

import gc
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

BUSY_CORES = 0.25  # other load (in cores) above which a figure is flagged as disturbed


def role(proc: psutil.Process) -> str:
    """A short name for one of the benchmark's processes: the module a ``python -m`` runs (the
    engine, the gateway, a rollout worker), else its executable's name."""
    try:
        args = proc.cmdline()
    except psutil.Error:
        return "?"
    if "-m" in args[:-1]:
        module = args[args.index("-m") + 1]
        rest = [a for a in args[args.index("-m") + 2 :][:2] if not a.startswith("-")]
        return " ".join([module, *rest]) if module in ("areal", "vllm") else module
    return Path(args[0]).name if args else "?"


class LoadMonitor(threading.Thread):
    """CPU used by processes outside this process tree, per phase, in cores (0 = quiet); and
    within the tree, per process role (``own_cores``), to see where a phase's CPU went."""

    def __init__(self, interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.phase = ""
        self.busy: dict[str, list[float]] = defaultdict(list)
        self.own: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        # this process's own threads (the trainer's, in async_vs_sync.py), by thread name
        self.threads: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.seconds: dict[str, float] = defaultdict(float)  # each phase's time measured
        # this process's cyclic garbage collections, per phase: generation -> [count, seconds]
        self.gc: dict[str, dict[int, list[float]]] = defaultdict(
            lambda: defaultdict(lambda: [0, 0.0])
        )
        self._gc_started = 0.0
        gc.callbacks.append(self._on_gc)
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

    def own_cores(self, phase: str) -> dict[str, float]:
        """This process tree's CPU over ``phase`` by role, in cores, the busiest first."""
        seconds = self.seconds.get(phase) or 1.0
        used = self.own.get(phase, {})
        return {k: v / seconds for k, v in sorted(used.items(), key=lambda kv: -kv[1])}

    def own_threads(self, phase: str) -> dict[str, float]:
        """This process's CPU over ``phase`` by thread, in cores, the busiest first."""
        seconds = self.seconds.get(phase) or 1.0
        used = self.threads.get(phase, {})
        return {k: v / seconds for k, v in sorted(used.items(), key=lambda kv: -kv[1])}

    def stop(self) -> None:
        self._stop_event.set()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def gc_seconds(self, phase: str) -> dict[str, dict[str, float]]:
        """This process's garbage collections over ``phase``: count and seconds by generation."""
        return {
            f"gen{gen}": {"collections": n, "seconds": round(sec, 4)}
            for gen, (n, sec) in sorted(self.gc.get(phase, {}).items())
        }

    def _on_gc(self, event: str, info: dict[str, int]) -> None:
        if event == "start":
            self._gc_started = time.perf_counter()
        elif self.phase:
            entry = self.gc[self.phase][info["generation"]]
            entry[0] += 1
            entry[1] += time.perf_counter() - self._gc_started

    def run(self) -> None:
        me = psutil.Process()
        seen: dict[int, float] = {}
        last_busy, last_time = _busy_seconds(), time.monotonic()
        roles: dict[int, str] = {me.pid: "benchmark (trainer)"}
        thread_seen: dict[int, float] = {}
        while not self._stop_event.wait(self.interval):
            by_thread = self._thread_cpu(me, thread_seen)
            mine = 0.0
            by_role: dict[str, float] = defaultdict(float)
            for proc in [me, *me.children(recursive=True)]:
                try:
                    t = proc.cpu_times()
                except psutil.Error:
                    continue
                total = t.user + t.system
                used = total - seen.get(proc.pid, 0.0)
                mine += used
                seen[proc.pid] = total
                if proc.pid not in roles:
                    roles[proc.pid] = role(proc)
                by_role[roles[proc.pid]] += used
            busy, now = _busy_seconds(), time.monotonic()
            if self.phase:
                other = (busy - last_busy - mine) / (now - last_time)
                self.busy[self.phase].append(max(0.0, other))
                self.seconds[self.phase] += now - last_time
                for name, used in by_role.items():
                    self.own[self.phase][name] += used
                for name, used in by_thread.items():
                    self.threads[self.phase][name] += used
            last_busy, last_time = busy, now

    @staticmethod
    def _thread_cpu(me: psutil.Process, seen: dict[int, float]) -> dict[str, float]:
        """CPU seconds of this process's threads since the last call, by name: Python's thread
        name where the thread is Python's, else the kernel's (ZeroMQ's I/O thread, torch's);
        and under "<name> in the kernel" the part of it spent in the kernel."""
        names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
        used: dict[str, float] = defaultdict(float)
        try:
            threads = me.threads()
        except psutil.Error:
            return used
        for thread in threads:
            total = thread.user_time + thread.system_time
            name = (names.get(thread.id) or _comm(thread.id)).rstrip("0123456789_")
            used[name] += total - seen.get(thread.id, 0.0)
            seen[thread.id] = total
            # ... and of that, in the kernel (page faults, zeroing fresh pages, system calls)
            kernel_key = -thread.id  # the same thread's system time seen so far
            used[f"{name} in the kernel"] += thread.system_time - seen.get(kernel_key, 0.0)
            seen[kernel_key] = thread.system_time
        return used


def _comm(tid: int) -> str:
    try:
        return Path(f"/proc/self/task/{tid}/comm").read_text().strip()
    except OSError:
        return str(tid)


def _busy_seconds() -> float:
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)
