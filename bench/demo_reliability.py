"""How often does ``make demo`` pass on this machine? Runs the demo N times from scratch.

Each run is what a newcomer's first ``make demo`` is: a fresh output directory (no cached tiny
model, no cached warm start), ``python -m areal.demo`` as the Makefile runs it, its own check
(the task success rate of the last 20 % of steps beats the first 20 % by ≥ 0.4). With ``--load`` a
CPU-bound process (a busy loop) runs beside each demo: "idle or with one other CPU-bound process
running". Prints the pass count, the distribution of the success rate's rise (and of the
reward's), the wall time of each run, and
for a failed run the demo's own diagnosis line; ``--json`` keeps it all.

    .venv/bin/python bench/demo_reliability.py --runs 20 [--load] [--json out.json] [--set k=v]

``--real`` runs ``make demo-real`` instead (``python -m areal.demo_real``, configs/real.yaml: the
real model, held-out success before and after); its rise is the held-out one, its check a rise of
at least 0.10 (``make real-model`` first).

    .venv/bin/python bench/demo_reliability.py --real --runs 5
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from areal.demo import first_and_last

REPO = Path(__file__).resolve().parents[1]


def busy() -> None:
    """One core's worth of CPU load, until killed."""
    x = 0
    while True:
        x = (x * 1103515245 + 12345) % 2**31


# The loop's counters that say what was trained and what thrown away (a run's summary.json).
COUNTERS = ("trained", "dropped_stale", "dropped_late", "groups_split", "groups_split_at_bound")


DEMOS = {
    False: ("areal.demo", "configs/quickstart.yaml"),
    True: ("areal.demo_real", "configs/real.yaml"),
}


def one_run(out: Path, overrides: list[str], real: bool = False) -> dict[str, Any]:
    """One fresh demo in ``out``: passed, rise, wall seconds, and the demo's last lines."""
    shutil.rmtree(out, ignore_errors=True)
    module, config = DEMOS[real]
    command = [sys.executable, "-m", module, "--config", config, "--output-dir", str(out)]
    for item in overrides:
        command += ["--set", item]
    started = time.monotonic()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    seconds = time.monotonic() - started
    record: dict[str, Any] = {"passed": done.returncode == 0, "seconds": round(seconds, 1)}
    summary = out / "summary.json"
    if summary.is_file():
        history = json.loads(summary.read_text())["history"]
        first, last = first_and_last([h.get("success", 0.0) for h in history])
        record.update(first=round(first, 3), last=round(last, 3), rise=round(last - first, 3))
        first, last = first_and_last([h["reward"] for h in history])
        record["reward"] = [round(first, 3), round(last, 3)]
        record["flat_groups"] = [int(h.get("flat_groups", 0)) for h in history]
        counters = json.loads(summary.read_text()).get("counters", {})
        record["counters"] = {k: counters[k] for k in COUNTERS if k in counters}
        record["peak_rss_bytes"] = json.loads(summary.read_text()).get("peak_rss_bytes")
    heldout = out / "demo_real.json"
    if real and heldout.is_file():  # the rise that counts: held-out success, before -> after
        found = json.loads(heldout.read_text())
        first, last = found["before"]["success"], found["after"]["success"]
        record.update(first=round(first, 3), last=round(last, 3), rise=round(last - first, 3))
    tail = [line for line in done.stdout.splitlines() if line.strip()][-3:]
    record["tail"] = tail
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--load", action="store_true", help="a CPU-bound process beside each run")
    parser.add_argument("--json", type=Path, help="write every run's record here")
    parser.add_argument("--set", action="append", default=[], help="a demo override, key=value")
    parser.add_argument("--real", action="store_true", help="make demo-real: held-out success")
    args = parser.parse_args()
    records = []
    with tempfile.TemporaryDirectory(prefix="areal-demo-") as tmp:
        for i in range(args.runs):
            loader = multiprocessing.Process(target=busy, daemon=True) if args.load else None
            if loader is not None:
                loader.start()
            try:
                record = one_run(Path(tmp) / f"run{i}", args.set, args.real)
            finally:
                if loader is not None:
                    loader.kill()
                    loader.join()
            records.append(record)
            verdict = "pass" if record["passed"] else "FAIL"
            print(
                f"run {i + 1}/{args.runs}: {verdict} success rise "
                f"{record.get('rise', float('nan')):+.2f} ({record.get('first', 0):.2f} -> "
                f"{record.get('last', 0):.2f}), reward {record.get('reward', [0, 0])[0]:.2f} -> "
                f"{record.get('reward', [0, 0])[1]:.2f}, {record['seconds']:.0f} s; "
                + ", ".join(f"{k} {v}" for k, v in record.get("counters", {}).items()),
                flush=True,
            )
            if not record["passed"]:
                for line in record["tail"]:
                    print(f"    {line}", flush=True)
    passed = sum(r["passed"] for r in records)
    rises = sorted(r["rise"] for r in records if "rise" in r)
    seconds = [r["seconds"] for r in records]
    print(f"passed {passed}/{len(records)}{' (with one CPU-bound process beside)' * args.load}")
    if rises:
        print(
            f"success rise: min {rises[0]:+.2f}, median {statistics.median(rises):+.2f}, "
            f"max {rises[-1]:+.2f}; all: {', '.join(f'{r:+.2f}' for r in rises)}"
        )
    print(f"wall time: median {statistics.median(seconds):.0f} s, max {max(seconds):.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"load": args.load, "runs": records}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
