"""``bench/tree_memory.py`` on a real process tree: a parent whose child holds 64 MiB."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import psutil

BENCH = Path(__file__).resolve().parents[2] / "bench"
spec = importlib.util.spec_from_file_location("bench_tree_memory", BENCH / "tree_memory.py")
assert spec is not None and spec.loader is not None
tree_memory = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = tree_memory  # dataclasses look their module up there
spec.loader.exec_module(tree_memory)

CHILD = "import time; held = bytearray(64 * 2**20); held[::4096] = b'x' * len(held[::4096]); time.sleep(30)"
PARENT = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {CHILD!r}])"


def label(proc: psutil.Process, is_root: bool) -> str:
    return "parent" if is_root else "child"


def test_the_child_s_peak_is_seen_and_summed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT])
    sampler = tree_memory.TreeSampler(parent.pid, label, interval=0.1)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            sampler.sample()
            child = [p for p in sampler.processes.values() if p.label == "child"]
            # Until both peaks show the whole array: the kernel's high-water mark (RSS) can
            # pass 64 MiB while the sampled PSS still trails the child's last pages.
            if child and child[0].peak_rss > 64 * 2**20 and child[0].peak_pss > 60 * 2**20:
                break
            time.sleep(0.1)
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
