"""Plot metrics of one or more runs: ``python -m areal.tools.plot_metrics --log-dir LOGS
--metric loss --metric reward --output plots/loss_curve.png``.

Reads ``{log_dir}/metrics.jsonl`` (one JSON object per event). A metric is ``key`` (taken from
``train`` events) or ``event/key`` (e.g. ``rollout/reward``). One panel per metric, one line per
log dir, so a sync and an async run can be overlaid (``--log-dir A --log-dir B``). Headless
(matplotlib's Agg backend): it works over SSH and in CI.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DEFAULT_EVENT = "train"


def read_records(log_dir: str | Path) -> list[dict[str, Any]]:
    """Every record of a run's ``metrics.jsonl``."""
    path = Path(log_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (is {log_dir} a run's log dir?)")
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def series(records: Sequence[dict[str, Any]], metric: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of one metric (``key`` of the train event, or ``event/key``)."""
    event, _, key = metric.rpartition("/")
    event = event or DEFAULT_EVENT
    steps: list[int] = []
    values: list[float] = []
    for record in records:
        value = record.get(key)
        if record.get("event") == event and isinstance(value, int | float):
            steps.append(int(record["step"]))
            values.append(float(value))
    return steps, values


def read_series(log_dir: str | Path, metric: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of one metric in a run's ``metrics.jsonl``."""
    return series(read_records(log_dir), metric)


def plot(
    log_dirs: Sequence[str | Path],
    metrics: Sequence[str],
    output: str | Path,
    *,
    labels: Sequence[str] | None = None,
    title: str | None = None,
) -> Path:
    """Write the figure to ``output`` (PNG, SVG or PDF by its suffix); returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(labels) if labels else [str(d) for d in log_dirs]
    runs = [read_records(d) for d in log_dirs]  # each file read once, whatever the metrics
    fig, axes = plt.subplots(len(metrics), 1, figsize=(7, 2.6 * len(metrics)), squeeze=False)
    for ax, metric in zip(axes[:, 0], metrics, strict=True):
        empty = True
        for records, label in zip(runs, labels, strict=True):
            steps, values = series(records, metric)
            if steps:
                ax.plot(steps, values, label=label, linewidth=1.5)
                empty = False
        if empty:
            raise ValueError(f"no {metric!r} values in {', '.join(map(str, log_dirs))}")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        if len(log_dirs) > 1:
            ax.legend()
    axes[-1, 0].set_xlabel("step")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m areal.tools.plot_metrics", description=__doc__)
    parser.add_argument("--log-dir", action="append", required=True, help="a run's log dir")
    parser.add_argument("--metric", action="append", required=True, help="key or event/key")
    parser.add_argument("--output", required=True, help="image file (png, svg, pdf)")
    parser.add_argument("--label", action="append", help="legend label per --log-dir")
    parser.add_argument("--title")
    args = parser.parse_args(argv)
    if args.label and len(args.label) != len(args.log_dir):
        parser.error("give one --label per --log-dir")
    try:
        path = plot(args.log_dir, args.metric, args.output, labels=args.label, title=args.title)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
