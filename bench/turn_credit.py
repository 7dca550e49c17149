"""Does crediting turns speed learning? Steps to 0.9 success on the calculator, turn credit
against outcome-only training, over seeds (issue 50).

Each run is ``python -m areal.demo`` (configs/quickstart.yaml: the ``calculator`` task, two
model calls an episode, turn 1 names a key, turn 2 answers) for ``--max-steps`` steps, in one of
three arms:

- ``outcome``: the demo as it is: reward 1 for the right answer, nothing else; GRPO.
- ``turn``: turn credit. Turn 1 pressing the key that squares earns ``--key-reward`` (0.5) as
  turn 1's own reward (``dataset.options.key_reward_to: turn``), so turn 1's return is
  ``0.5 + R`` and turn 2's ``R``; ``algorithm.advantage: turn`` (each turn's return against the
  other episodes' at that turn) with ``normalize_std: true``, GRPO's scale, so the arm differs
  from ``outcome`` in where the credit goes and not in the step size.
- ``episode``: the same key reward added to the episode's reward (``key_reward_to: episode``):
  the same total as ``turn``, but every token of the episode credited with the sum; GRPO.

The key reward is below the answer's 1, so the step's ``success`` (reward >= 1) counts right
answers only in every arm. Seed ``s`` sets ``train.seed`` (the tiny model's init, the warm
start's order, training) and ``dataset.seed`` (the questions). The arms of one seed run one after
another in one output directory, so they start from the same warm-started model, made once per
seed (no option changes it; ``areal.demo`` keeps it and clears the rest), and drift of a busy
machine hits every arm of a seed alike.

A run reaches the target at the first step ``t`` whose success averaged over steps
``t - window + 1 .. t`` (``--window 3``) is at least ``--target`` (0.9): one lucky step of 128
episodes does not count. Per arm it prints that step for each seed, its median and range, the
runs that never reached it within ``--max-steps``, the training seconds to reach it (from the
run's ``run`` event to the step's, in metrics.jsonl: the warm start excluded), the final success
and the wall time; then each arm's median against ``outcome``'s.

    .venv/bin/python bench/turn_credit.py --seeds 5 --max-steps 40 --json turn_credit.json
    .venv/bin/python bench/turn_credit.py --seeds 1 --arms outcome,turn --max-steps 30  # smoke
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
KEY_REWARD = 0.5


@dataclass(frozen=True)
class Arm:
    name: str
    what: str
    overrides: tuple[str, ...]


def arms(key_reward: float) -> dict[str, Arm]:
    """The arms, by name, with the ``--set`` overrides that make each one."""
    key = f"dataset.options.key_reward={key_reward}"
    return {
        "outcome": Arm("outcome", "reward 1 for the right answer only; advantage grpo", ()),
        "turn": Arm(
            "turn",
            f"+{key_reward} for the right key as turn 1's reward; advantage turn, normalize_std",
            (
                key,
                "dataset.options.key_reward_to=turn",
                "algorithm.advantage=turn",
                "algorithm.advantage_options.normalize_std=true",
            ),
        ),
        "episode": Arm(
            "episode",
            f"+{key_reward} for the right key added to the episode's reward; advantage grpo",
            (key, "dataset.options.key_reward_to=episode"),
        ),
    }


# --- reading a run ------------------------------------------------------------------------------


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl (a torn last line, from a killed run, skipped)."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def steps_to_target(success: Sequence[float], target: float, window: int) -> int | None:
    """The first step (1-based) whose success averaged over the last ``window`` steps (fewer at
    the start: a window never reaches before step ``window``) is at least ``target``."""
    for end in range(window, len(success) + 1):
        if statistics.fmean(success[end - window : end]) >= target - 1e-9:
            return end
    return None


def run_record(records: list[dict[str, Any]], target: float, window: int) -> dict[str, Any]:
    """A run's figures from its metrics: the success per step, the step and the training
    seconds to the target, the final success (mean of the last ``window`` steps)."""
    train = sorted((r for r in records if r.get("event") == "train"), key=lambda r: r["step"])
    success = [float(r.get("success", math.nan)) for r in train]
    step = steps_to_target(success, target, window)
    started = next((r["time"] for r in records if r.get("event") == "run"), None)
    seconds = None
    if step is not None and started is not None:
        seconds = round(train[step - 1]["time"] - started, 1)
    final = statistics.fmean(success[-window:]) if success else math.nan
    trained = round(train[-1]["time"] - started, 1) if train and started is not None else None
    return {
        "steps": len(success),
        "success": [round(s, 3) for s in success],
        "steps_to_target": step,
        "seconds_to_target": seconds,
        "final_success": round(final, 3),
        "train_seconds": trained,  # the run event to the last step: no model, no warm start
    }


def one_run(
    out: Path, config: str, seed: int, max_steps: int, overrides: Sequence[str]
) -> dict[str, Any]:
    """``python -m areal.demo`` in ``out`` with ``overrides``; its metrics (read before the next
    run in ``out`` clears them) and wall time."""
    command = [sys.executable, "-m", "areal.demo", "--config", config, "--output-dir", str(out)]
    for item in (
        f"train.max_steps={max_steps}",
        f"train.seed={seed}",
        f"dataset.seed={seed}",
        *overrides,
    ):
        command += ["--set", item]
    started = time.monotonic()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    return {
        "returncode": done.returncode,
        "wall_seconds": round(time.monotonic() - started, 1),
        "records": read_metrics(out / "logs" / "metrics.jsonl"),
        "tail": [line for line in (done.stdout + done.stderr).splitlines() if line.strip()][-5:],
    }


# --- the report ---------------------------------------------------------------------------------


def median_steps(steps: Sequence[int | None]) -> float | None:
    """The median step to the target, a run that never reached it counted as later than any
    that did; None when the median falls among those runs (it is past ``--max-steps``)."""
    if not steps:
        return None
    middle = statistics.median(math.inf if s is None else float(s) for s in steps)
    return None if math.isinf(middle) else middle


def arm_summary(runs: Sequence[dict[str, Any]], max_steps: int) -> dict[str, Any]:
    steps = [r["steps_to_target"] for r in runs]
    reached = [s for s in steps if s is not None]
    return {
        "per_seed": steps,
        "median": median_steps(steps),
        "range": [min(reached), max(reached)] if reached else None,
        "not_reached": len(steps) - len(reached),
        "median_seconds_to_target": _median(r["seconds_to_target"] for r in runs),
        "median_final_success": statistics.median(r["final_success"] for r in runs),
        "median_train_seconds": _median(r["train_seconds"] for r in runs),
        "median_wall_seconds": statistics.median(r["wall_seconds"] for r in runs),
    }


def _median(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def paired_ratios(
    runs: Sequence[dict[str, Any]], baseline: Sequence[dict[str, Any]]
) -> list[float]:
    """Per seed, the arm's steps to the target over the baseline's (both reached it)."""
    by_seed = {r["seed"]: r["steps_to_target"] for r in baseline}
    return [
        r["steps_to_target"] / by_seed[r["seed"]]
        for r in runs
        if r["steps_to_target"] is not None and by_seed.get(r["seed"])
    ]


def shown(value: float | None, max_steps: int) -> str:
    return f"> {max_steps}" if value is None else f"{value:g}"


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def report(
    results: dict[str, list[dict[str, Any]]], chosen: dict[str, Arm], args: argparse.Namespace
) -> dict[str, Any]:
    """Print the table and the ratios; returns the summaries."""
    rule = f"success >= {args.target} (mean over {args.window} steps)"
    print(f"\nsteps to {rule}, {args.seeds} seed(s), at most {args.max_steps} steps")
    summaries = {name: arm_summary(runs, args.max_steps) for name, runs in results.items()}
    print(
        "arm       | steps per seed      | median | range   | not reached | s to target | "
        "final success | train s | wall s"
    )
    for name, s in summaries.items():
        per_seed = ", ".join("-" if v is None else str(v) for v in s["per_seed"])
        span = "-" if s["range"] is None else f"{s['range'][0]}-{s['range'][1]}"
        print(
            f"{name:<9} | {per_seed:<19} | {shown(s['median'], args.max_steps):>6} | {span:<7} | "
            f"{s['not_reached']:>11} | {seconds(s['median_seconds_to_target']):>11} | "
            f"{s['median_final_success']:>13.2f} | {seconds(s['median_train_seconds']):>7} | "
            f"{s['median_wall_seconds']:>6.0f}"
        )
    print(
        "(medians over seeds; s to target and train s run from the run's start, after the warm "
        "start; wall s is the whole process, a seed's first run also making its warm start)"
    )
    for name, arm in chosen.items():
        print(f"  {name}: {arm.what}")
    if "outcome" in summaries:
        base = summaries["outcome"]["median"]
        for name in summaries:
            if name == "outcome":
                continue
            mine = summaries[name]["median"]
            ratio = f"{mine / base:.2f}" if mine is not None and base else "n/a (censored)"
            paired = paired_ratios(results[name], results["outcome"])
            each = ", ".join(f"{p:.2f}" for p in paired) or "none"
            summaries[name]["ratio_to_outcome"] = None if not paired else statistics.median(paired)
            print(
                f"{name} / outcome, median steps to target: {ratio}; per seed (both reached): "
                f"{each}"
            )
    return summaries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0 .. N-1, every arm each")
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--arms", default="outcome,turn,episode", help="comma-separated")
    parser.add_argument("--key-reward", type=float, default=KEY_REWARD)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--window", type=int, default=3, help="steps the success is averaged on")
    parser.add_argument("--config", default="configs/quickstart.yaml")
    parser.add_argument("--set", action="append", default=[], help="an override for every arm")
    parser.add_argument(
        "--keep", type=Path, help="run here and keep the runs (default: a temp dir)"
    )
    parser.add_argument("--json", type=Path, help="write every run and the summaries here")
    args = parser.parse_args(argv)
    known = arms(args.key_reward)
    names = [n.strip() for n in args.arms.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        parser.error(f"--arms: {', '.join(unknown) or 'none'}; the arms are {', '.join(known)}")
    chosen = {name: known[name] for name in names}
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in chosen}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="areal-turn-credit-") as tmp:
        root = args.keep or Path(tmp)
        for seed in range(args.seeds):
            for name, arm in chosen.items():
                overrides = [*arm.overrides, *args.set]
                run = one_run(root / f"seed{seed}", args.config, seed, args.max_steps, overrides)
                record = {
                    "arm": name,
                    "seed": seed,
                    **run_record(run.pop("records"), args.target, args.window),
                    **run,
                }
                results[name].append(record)
                step = record["steps_to_target"]
                print(
                    f"seed {seed} {name}: {'not reached' if step is None else f'step {step}'} "
                    f"in {record['steps']} steps, final success {record['final_success']:.2f}, "
                    f"{record['wall_seconds']:.0f} s",
                    flush=True,
                )
                if record["steps"] < args.max_steps:  # the run stopped early: say why
                    print(f"    exit {record['returncode']}; " + " | ".join(record["tail"]))
    summaries = report(results, chosen, args)
    total = time.monotonic() - started
    print(f"wall time: {total:.0f} s for {sum(len(r) for r in results.values())} runs")
    if args.json:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        out = {"settings": settings, "arms": summaries, "runs": results, "wall_seconds": total}
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
