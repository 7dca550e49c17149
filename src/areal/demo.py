"""``make demo``: the main job — asynchronous RL of an unmodified openai-SDK agent, on CPU.

It runs ``areal train configs/quickstart.yaml``: areal's tiny model is created, a cached format
warm start teaches it what an episode of the ``calculator`` task looks like, then the run starts
an inference engine, the gateway, a rollout worker running the task's openai-SDK agent (two
model calls per episode, the calculator's answer in between), and the trainer, which learns from
the recorded tokens while the engine keeps generating. At the end it writes the reward/loss plot
and says whether the reward of the last 20 % of steps beat the first 20 % by at least 0.5.

Everything goes under ``--output-dir`` (``make demo DEMO_DIR=x``): the tiny model, the warm
start, logs, checkpoints and the plot. A fresh run each time: the previous run's checkpoints, logs
and weights are removed; the tiny model and the warm start are cached there and reused. When the
rise falls short, :func:`diagnose` says in a line or two what the run did instead.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from areal.core.config import ConfigError
from areal.core.run_config import RunConfig, load_run_config

console = Console()
TARGET_GAIN = 0.4  # of the task success rate, first 20 % of steps to the last 20 %


def fresh_run(config: RunConfig, out: Path) -> None:
    """Remove the previous run's outputs, keeping the cached model and warm start."""
    for name in ("checkpoints", "run", "weights", "summary.json"):
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    shutil.rmtree(config.logging.directory(out), ignore_errors=True)


def demo_config(path: str, out: Path, overrides: list[str]) -> RunConfig:
    """The run config with the model and the logs under ``out`` (a ``--set`` still wins)."""
    placed = [f"model.path={out / 'model'}", f"logging.log_dir={out / 'logs'}"]
    return load_run_config(path, [*placed, *overrides])


def first_and_last(values: list[float], fraction: float = 0.2) -> tuple[float, float]:
    """Mean of the first and of the last ``fraction`` of the steps' values."""
    k = max(1, round(len(values) * fraction))
    return sum(values[:k]) / k, sum(values[-k:]) / k


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m areal.demo", description=__doc__)
    parser.add_argument("--config", default="configs/quickstart.yaml")
    parser.add_argument("--output-dir", default="runs/quickstart")
    parser.add_argument("--set", action="append", default=[], help="override: key=value")
    args = parser.parse_args(argv)
    from areal.run.train import LOG_FORMAT

    logging.basicConfig(level="INFO", format=LOG_FORMAT)
    out = Path(args.output_dir)
    try:
        config = demo_config(args.config, out, args.set)
    except ConfigError as err:
        console.print(f"[red]error:[/red] {err}")
        return 2
    fresh_run(config, out)

    from areal.run.runner import RunError, train
    from areal.tools.plot_metrics import plot

    console.rule("areal demo: asynchronous RL of an openai-SDK agent on the tiny model (CPU)")
    try:
        summary = train(config, out)
    except RunError as err:
        console.print(f"[red]error:[/red] {err}")
        return 1
    rewards = first_and_last([h["reward"] for h in summary.history])
    success = first_and_last([h.get("success", 0.0) for h in summary.history])
    figure = plot(
        [config.logging.directory(out)],
        ["reward", "success", "loss"],
        out / "reward_loss.png",
        title="areal demo: calculator task, async GRPO",
    )
    table = Table(title="areal demo")
    table.add_column("")
    table.add_column("first 20 % of steps", justify="right")
    table.add_column("last 20 % of steps", justify="right")
    table.add_row("task success rate (the right answer)", f"{success[0]:.3f}", f"{success[1]:.3f}")
    table.add_row("mean reward", f"{rewards[0]:.3f}", f"{rewards[1]:.3f}")
    console.print(table)
    facts = Table(show_header=False)
    facts.add_row("steps (policy versions)", str(summary.steps))
    facts.add_row("wall time", f"{summary.seconds:.0f} s")
    facts.add_row("samples trained", str(summary.counters["trained"]))
    facts.add_row("samples dropped as stale", str(summary.counters["dropped_stale"]))
    facts.add_row("train.log", str(config.logging.directory(out) / "train.log"))
    facts.add_row("plot", str(figure))
    facts.add_row("checkpoint", str(summary.checkpoint))
    console.print(facts)
    gain = success[1] - success[0]
    if gain >= TARGET_GAIN:
        console.print(
            f"[green]the agent got better: it answers right {success[1]:.0%} of the time, "
            f"up from {success[0]:.0%} (+{gain:.2f})[/green]"
        )
        return 0
    console.print(
        f"[yellow]task success rose {gain:+.2f} ({success[0]:.0%} -> {success[1]:.0%}), "
        f"below the {TARGET_GAIN} the demo expects[/yellow]"
    )
    console.print(diagnose(summary.history))
    console.print(f"the curve: {figure}")
    return 1


def diagnose(history: list[dict[str, float]]) -> str:
    """Why task success did not rise enough, in a line or two, from the steps' statistics."""
    fell = collapse(history)
    if fell:
        return fell
    flat_from = None
    for h in history:
        all_flat = h.get("groups", 0) > 0 and h.get("flat_groups", 0) >= h["groups"]
        flat_from = (flat_from or int(h["step"])) if all_flat else None
    if flat_from is not None:
        reward = history[-1]["reward"]
        return (
            f"from step {flat_from} on every group had equal rewards ({reward:.2f}): zero "
            "advantages, no learning signal (no sample of a group did better than the rest). "
            "Try --set algorithm.group_size=16 or --set sampling.temperature=1.2"
        )
    flat = sum(h.get("flat_groups", 0) for h in history)
    groups = sum(h.get("groups", 0) for h in history) or 1
    if flat / groups > 0.5:
        return (
            f"{flat / groups:.0%} of the groups had equal rewards (no learning signal in them); "
            "try --set algorithm.group_size=16"
        )
    return (
        "the groups did differ, so the policy learned, but not enough in this many steps; try "
        "--set train.max_steps=60"
    )


def collapse(history: list[dict[str, float]]) -> str | None:
    """The run learned, then lost it: success at its peak (over 3 steps) well above the last
    20 % of steps. Named with the step it fell at and that step's policy drift."""
    key = "success" if all("success" in h for h in history) else "reward"
    values = [h[key] for h in history]
    if len(values) < 5:
        return None
    smooth = [sum(values[i : i + 3]) / 3 for i in range(len(values) - 2)]
    peak = max(range(len(smooth)), key=smooth.__getitem__)
    _, last = first_and_last(values)
    if smooth[peak] - last < TARGET_GAIN:
        return None
    fell = next((i for i in range(peak, len(values)) if values[i] < smooth[peak] / 2), None)
    if fell is None:
        return None
    kl = max((abs(h.get("behave_approx_kl", 0.0)) for h in history[peak : fell + 1]), default=0)
    return (
        f"{key} reached {smooth[peak]:.0%} around step {int(history[peak + 1]['step'])}, then "
        f"fell to {values[fell]:.0%} at step {int(history[fell]['step'])} (largest "
        f"|behave_approx_kl| on the way {kl:.2f}): an update threw the policy off what it had "
        "learned. Try --set train.learning_rate=5e-4"
    )


if __name__ == "__main__":
    sys.exit(main())
