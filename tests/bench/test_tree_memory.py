"""``bench/tree_memory.py`` on a real process tree: a parent whose child holds 64 MiB."""

from __future__ import annotations

import subprocess
import sys

import psutil

from support import eventually
from support.cli import bench_script

tree_memory = bench_script("tree_memory")

MIB = 2**20
# The child touches every page of its 64 MiB, then lives until it is killed.
CHILD = (
    "import signal; held = bytearray(64 * 2**20); held[::4096] = b'x' * len(held[::4096]); "
    "signal.pause()"
)
PARENT = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {CHILD!r}])"


def label(proc: psutil.Process, is_root: bool) -> str:
    return "parent" if is_root else "child"


def test_the_child_s_peak_is_seen_and_summed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT])
    sampler = tree_memory.TreeSampler(parent.pid, label, interval=0.1)

    def both_peaks() -> bool:
        """Both peaks show the whole array: the kernel's high-water mark (RSS) can pass 64 MiB
        while the sampled PSS still trails the child's last pages."""
        sampler.sample()
        child = [p for p in sampler.processes.values() if p.label == "child"]
        return bool(child) and child[0].peak_rss > 64 * MIB and child[0].peak_pss > 60 * MIB

    try:
        eventually(both_peaks, 60, "the child's 64 MiB in its sampled peaks")
    finally:
        for proc in psutil.Process(parent.pid).children(recursive=True):
            proc.kill()
        parent.kill()
        parent.wait()
    report = sampler.report()
    rows = {row["label"]: row for row in report["processes"]}
    assert set(rows) == {"parent", "child"}
    assert rows["child"]["peak_rss_mib"] > 64
    assert rows["child"]["peak_pss_mib"] > 60  # its own pages: not shared
    total = rows["child"]["peak_rss_mib"] + rows["parent"]["peak_rss_mib"]
    assert abs(report["sum_of_peak_rss_mib"] - total) < 0.2
    assert report["peak_of_total_rss_mib"] > 64
    assert max(report["timeline_mib"]["child"]) > 64
