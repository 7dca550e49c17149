"""Memory of a run, bounded and reported: peak RSS of every process of ``make demo`` (or of a run
of ``--minutes`` minutes), the trajectory queue's bytes against ``queue_max_size``, and the
engine's KV pool against its budget.

Run: ``.venv/bin/python bench/memory.py [--minutes 10] [--json PATH]``.

It runs ``python -m areal.demo --config configs/quickstart.yaml`` as ``make demo`` does, in a
fresh output directory (so the tiny model and the warm start are built, as on a first
``make demo``), and samples the demo's process tree from /proc every ``--interval`` seconds
(``bench/tree_memory.py``): the demo process itself (the supervisor, the warm start and the
trainer), the engine, the gateway and the rollout worker. With ``--minutes M`` the run gets
no step limit and is stopped with SIGTERM after M minutes (it finishes its step and exits).

While it runs, the engine's ``/server_info`` gives its KV pool: capacity (the budget, reserved
at start), bytes, and the most slots held at once (``kv_peak_used_tokens``). At the end, the
run's ``metrics.jsonl`` gives the queue's peak (``trajectories_queued_peak``, ``queue_peak_bytes``
on the wire); what a trajectory takes once decoded in the trainer is measured here with
tracemalloc, so the bound, ``queue_max_size`` trajectories, is also given in decoded bytes.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import urllib.request
from pathlib import Path
from typing import Any

import psutil

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from tree_memory import MiB, TreeSampler  # noqa: E402

from areal.plugins.queues import codec  # noqa: E402

ROOT = BENCH.parent
TARGET_DEMO_MIB = 4096  # the bound for all of the demo's processes together


def label_of(proc: psutil.Process, is_root: bool) -> str:
    """What a process of the run is, from its command line."""
    if is_root:
        return "demo: supervisor + warm start + trainer"
    cmd = " ".join(proc.cmdline())
    for needle, label in (
        ("areal.gateway.server", "gateway"),
        ("serve inference", "engine"),
        ("areal.run.rollout_worker", "rollout worker"),
        ("torchrun", "torchrun"),
        ("areal.run.on_node", "node shim"),
    ):
        if needle in cmd:
            return label
    return Path(proc.cmdline()[0]).name if proc.cmdline() else proc.name()


def _option(cmdline: str, name: str) -> str | None:
    words = cmdline.split()
    return words[words.index(name) + 1] if name in words[:-1] else None


class KVWatcher(threading.Thread):
    """Polls each engine's ``/server_info`` (found in the sampled tree) for its KV pool."""

    def __init__(self, sampler: TreeSampler, interval: float = 2.0) -> None:
        super().__init__(name="kv-watcher", daemon=True)
        self.sampler, self.interval = sampler, interval
        self.latest: dict[str, dict[str, Any]] = {}  # engine url -> its last /server_info
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            for peak in list(self.sampler.processes.values()):
                if peak.label != "engine":
                    continue
                host = _option(peak.cmdline, "--host") or "127.0.0.1"
                url = f"http://{host}:{_option(peak.cmdline, '--port')}"
                try:
                    with urllib.request.urlopen(f"{url}/server_info", timeout=2) as resp:
                        self.latest[url] = json.loads(resp.read())
                except (OSError, ValueError):
                    continue  # not up yet, or gone


def kv_report(info: dict[str, Any]) -> dict[str, Any]:
    capacity, nbytes = int(info["kv_capacity_tokens"]), int(info["kv_cache_bytes"])
    per_token = nbytes / (capacity + 1)  # the pool has one scratch slot beyond the budget
    peak = int(info.get("kv_peak_used_tokens", 0))
    return {
        "budget_tokens": capacity,
        "pool_mib": round(nbytes / MiB, 1),
        "peak_used_tokens": peak,
        "peak_used_mib": round(peak * per_token / MiB, 2),
        "peak_share_of_budget": round(peak / capacity, 4),
        "peak_running": info.get("peak_running"),
    }


def decoded_bytes(tokens: int, copies: int = 20) -> tuple[int, int]:
    """(wire bytes, bytes once decoded) of a one-sample trajectory of ``tokens`` tokens."""
    from trajectory_queue import trajectory

    frames = codec.encode(trajectory(tokens))
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    kept = [codec.decode(frames) for _ in range(copies)]
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    del kept
    return sum(len(f) for f in frames), used // copies


def queue_report(log_dir: Path) -> dict[str, Any]:
    events = [json.loads(x) for x in (log_dir / "metrics.jsonl").read_text().splitlines() if x]
    run: dict[str, Any] = next((e for e in events if e.get("event") == "run"), {})
    acc = [e for e in events if e.get("event") == "accounting"]
    limit = int(run.get("queue_max_size", 0))
    peak = max((int(e.get("trajectories_queued_peak", 0)) for e in acc), default=0)
    peak_bytes = max((int(e.get("queue_peak_bytes", 0)) for e in acc), default=0)
    mean_wire = peak_bytes / peak if peak else 0.0
    return {
        "queue_max_size": limit,
        "peak_trajectories": peak,
        "peak_wire_bytes": peak_bytes,
        "mean_wire_bytes_per_trajectory": round(mean_wire),
        "bound_wire_mib": round(limit * mean_wire / MiB, 2),
    }


def run_demo(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "areal.demo",
        "--config",
        args.config,
        "--output-dir",
        str(out),
    ]
    if args.minutes:
        command += ["--set", "train.max_steps=1000000"]
    log = (out.parent / f"{out.name}.out").open("w")
    started = time.monotonic()
    demo = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    sampler = TreeSampler(demo.pid, label_of, interval=args.interval).start()
    watcher = KVWatcher(sampler)
    watcher.start()
    stopped_by = "its end"
    try:
        if args.minutes:
            try:
                demo.wait(timeout=args.minutes * 60)
            except subprocess.TimeoutExpired:
                demo.send_signal(signal.SIGTERM)  # finish the step, checkpoint, stop
                stopped_by = f"SIGTERM after {args.minutes:g} min"
        demo.wait(timeout=args.timeout)
    finally:
        if demo.poll() is None:
            demo.kill()
        sampler.stop()
        watcher.stopped.set()
        log.close()
    seconds = time.monotonic() - started
    report = sampler.report()
    kv = {url: kv_report(info) for url, info in watcher.latest.items()}
    queue = queue_report(out / "logs")
    wire, decoded = decoded_bytes(max(1, round(queue["mean_wire_bytes_per_trajectory"] / 13)))
    queue["decoded_over_wire"] = round(decoded / wire, 2)
    queue["bound_decoded_mib"] = round(queue["bound_wire_mib"] * decoded / wire, 2)
    return {
        "command": " ".join(command[1:]),
        "exit_code": demo.returncode,
        "stopped_by": stopped_by,
        "seconds": round(seconds),
        "memory": report,
        "kv_pool": kv,
        "queue": queue,
    }


def print_report(result: dict[str, Any]) -> None:
    mem = result["memory"]
    print(
        f"\n{result['command']}: {result['seconds']} s, stopped by {result['stopped_by']}, "
        f"exit {result['exit_code']}; {mem['samples']} samples every {mem['interval_s']} s"
    )
    print(f"{'process':<42}{'peak RSS MiB':>14}{'peak PSS MiB':>14}")
    for row in mem["processes"]:
        print(f"{row['label']:<42}{row['peak_rss_mib']:>14.0f}{row['peak_pss_mib']:>14.0f}")
    total = mem["sum_of_peak_rss_mib"]
    verdict = "met" if total <= TARGET_DEMO_MIB else "NOT met"
    print(f"{'sum of the peaks':<42}{total:>14.0f}   (target ≤ {TARGET_DEMO_MIB} MiB: {verdict})")
    print(f"{'peak of the sum':<42}{mem['peak_of_total_rss_mib']:>14.0f}"
          f"{mem['peak_of_total_pss_mib']:>14.0f}")  # fmt: skip
    print(f"largest RSS (MiB) per {mem['timeline_window_s']:g} s:")
    for label, line in mem["timeline_mib"].items():
        print(f"  {label}: {' '.join(str(x) for x in line)}")
    for url, kv in result["kv_pool"].items():
        print(
            f"engine {url}: KV budget {kv['budget_tokens']} tokens = {kv['pool_mib']} MiB "
            f"(reserved at start); at most {kv['peak_used_tokens']} tokens held "
            f"({kv['peak_used_mib']} MiB, {100 * kv['peak_share_of_budget']:.1f} % of the budget)"
        )
    q = result["queue"]
    print(
        f"queue: at most {q['peak_trajectories']} of queue_max_size {q['queue_max_size']} "
        f"trajectories held, {q['peak_wire_bytes'] / 1024:.0f} KiB on the wire "
        f"(~{q['mean_wire_bytes_per_trajectory']} B each); the bound: {q['bound_wire_mib']} MiB "
        f"on the wire, {q['bound_decoded_mib']} MiB decoded (x{q['decoded_over_wire']})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--config", default="configs/quickstart.yaml")
    parser.add_argument("--minutes", type=float, help="run this long (no step limit), then stop")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("--timeout", type=float, default=1800.0, help="the run's own limit")
    parser.add_argument("--keep", type=Path, help="run in this output directory and keep it")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="areal-bench-memory-") as tmp:
        out = args.keep or Path(tmp) / "demo"
        out.parent.mkdir(parents=True, exist_ok=True)
        result = run_demo(args, out)
    print_report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["exit_code"] in (0, 1) else 1


if __name__ == "__main__":
    sys.exit(main())
