"""What a run takes of its machine: the peak resident memory of a process tree and the bytes a
directory holds on disk, read from ``/proc`` and ``stat``, and a size as people read it.

Peak RSS is each process's own peak (``VmHWM``: the kernel's high-water mark, so a spike between
two looks still counts), summed over the processes seen. The sum of peaks is an upper
bound of the tree's peak (the processes need not peak at once) and counts shared library pages
once per process, as RSS does; it is what to compare with a machine's memory before starting a
run there. Without ``/proc`` (macOS), each process's current RSS stands in for its peak.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def peak_rss(pid: int) -> int | None:
    """The peak RSS of one process in bytes, ``None`` once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass
    except (OSError, ValueError):
        return None
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return None


def tree_peaks(root: int | None = None) -> dict[int, int]:
    """The peak RSS in bytes of ``root`` (default: this process) and of every descendant alive
    now, by pid. Asked again later, merge with :func:`merged` to keep those gone since."""
    root = os.getpid() if root is None else root
    try:
        pids = [root, *(p.pid for p in psutil.Process(root).children(recursive=True))]
    except psutil.Error:
        return {}
    return {pid: peak for pid in pids if (peak := peak_rss(pid)) is not None}


def merged(earlier: dict[int, int], later: dict[int, int]) -> dict[int, int]:
    """Two looks at one tree: each process at the larger of its two peaks."""
    return {pid: max(earlier.get(pid, 0), later.get(pid, 0)) for pid in {*earlier, *later}}


def disk_bytes(path: str | Path) -> int:
    """Bytes of every file under ``path`` (a file: its own); links are not followed."""
    path = Path(path)
    if not path.is_dir():
        return path.stat().st_size if path.exists() else 0
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:  # removed while walked
                continue
    return total


def human_bytes(count: float) -> str:
    """``1.9 GiB``, ``12.3 MiB``, ``512 B``."""
    for unit in _UNITS[:-1]:
        if abs(count) < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} {_UNITS[-1]}"
