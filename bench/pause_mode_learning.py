"""Does ``inference.pause_mode`` change what a run learns? The demo and a longer run, in both modes.

``in_place`` keeps an in-flight generation's KV cache across a weight update (keys and values of
the old weights; the tokens after the update are sampled by the new weights and labelled with the
new version), ``retract`` re-prefills it on the new weights (exact, and on a CPU engine about half
the generation rate under updates). This runs, alternating the modes so machine drift hits both
alike: ``--runs`` fresh ``make demo`` runs per mode (the demo's own check: task success over the
last 20 % of steps beats the first 20 % by >= 0.4), then ``--long-runs`` runs per mode of
``--long-steps`` steps. It prints, per mode, the pass count, the success rise, the reward over the
last 20 % of steps, the share of trained samples whose tokens span more than one version, and the
wall time; the verdict line compares the modes' median final success.

    .venv/bin/python bench/pause_mode_learning.py --runs 4 --long-runs 2 --long-steps 90 \\
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from demo_reliability import one_run  # noqa: E402

MODES = ("in_place", "retract")


def mixed_share(out: Path) -> float:
    """The mean, over the run's steps, of the share of samples spanning several versions."""
    summary = out / "summary.json"
    if not summary.is_file():
        return float("nan")
    history = json.loads(summary.read_text())["history"]
    shares = [float(h.get("mixed_version_samples", 0.0)) for h in history]
    return statistics.fmean(shares) if shares else float("nan")


def run_both(
    tmp: Path, label: str, count: int, extra: list[str]
) -> dict[str, list[dict[str, Any]]]:
    """``count`` runs per mode, the modes alternating; each run's record with its mixed share."""
    records: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for i in range(count):
        for mode in MODES:
            out = tmp / f"{label}-{mode}-{i}"
            record = one_run(out, [f"inference.pause_mode={mode}", *extra])
            record["mixed_version_samples"] = round(mixed_share(out), 3)
            records[mode].append(record)
            print(
                f"{label} {i + 1}/{count} {mode:8s}: {'pass' if record['passed'] else 'FAIL'} "
                f"success {record.get('first', 0):.2f} -> {record.get('last', 0):.2f}, "
                f"mixed-version samples {record['mixed_version_samples']:.2f}, "
                f"{record['seconds']:.0f} s",
                flush=True,
            )
    return records


def report(label: str, records: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    """One line per mode; returns each mode's median final success."""
    finals: dict[str, float] = {}
    for mode in MODES:
        rows = records[mode]
        last = [r["last"] for r in rows if "last" in r]
        rises = [r["rise"] for r in rows if "rise" in r]
        finals[mode] = statistics.median(last) if last else float("nan")
        print(
            f"{label:5s} {mode:8s}: passed {sum(r['passed'] for r in rows)}/{len(rows)}, "
            f"final success median {finals[mode]:.2f} (range "
            f"{min(last, default=float('nan')):.2f}-{max(last, default=float('nan')):.2f}), "
            f"rise median {statistics.median(rises) if rises else float('nan'):+.2f}, "
            f"mixed-version samples {statistics.fmean(r['mixed_version_samples'] for r in rows):.2f}, "
            f"wall median {statistics.median(r['seconds'] for r in rows):.0f} s"
        )
    return finals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=4, help="demo runs per mode")
    parser.add_argument("--long-runs", type=int, default=2, help="longer runs per mode")
    parser.add_argument("--long-steps", type=int, default=90, help="train.max_steps of those")
    parser.add_argument("--json", type=Path, help="write every run's record here")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="areal-pause-") as tmp:
        if args.runs:
            results["demo"] = run_both(Path(tmp), "demo", args.runs, [])
        if args.long_runs:
            extra = [f"train.max_steps={args.long_steps}"]
            results["long"] = run_both(Path(tmp), "long", args.long_runs, extra)
    print()
    for label, records in results.items():
        finals = report(label, records)
        gap = finals["in_place"] - finals["retract"]
        print(f"{label:5s} in_place - retract, median final success: {gap:+.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
