"""``areal train CONFIG``: one asynchronous RL run (engines, gateway, rollout workers, trainer).

Example: ``areal train configs/quickstart.yaml --set train.max_steps=5``. torch is imported only
when the run starts, so ``areal train --help`` and config errors stay fast.
"""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from areal.cli.errors import CLIError
from areal.core.config import ConfigError


def train_command(
    config: Path = typer.Argument(..., help="Run config YAML (${VAR} read from the environment)."),
    overrides: list[str] = typer.Option(
        [], "--set", help="Override one key, e.g. --set async.enabled=false (the value is YAML)."
    ),
    output_dir: Path | None = typer.Option(
        None, "--output-dir", "-o", help="Checkpoints and run files (default: runs/<config name>)."
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint."),
    agent_config: Path | None = typer.Option(
        None, "--agent-config", help="An agent_config.py defining AGENT_CONFIG."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the resolved config and the processes, then exit."
    ),
) -> None:
    """Train a policy by asynchronous RL on a run config.

    Example: [bold]areal train configs/quickstart.yaml --set train.max_steps=5[/bold]
    """
    from areal import train as entry

    try:
        run_config = entry.load(str(config), overrides, str(agent_config) if agent_config else None)
    except ConfigError as err:
        raise CLIError(str(err)) from None
    out = output_dir or entry.default_output_dir(str(config))
    if dry_run:
        typer.echo(run_config.to_yaml())
        run = run_config.async_
        typer.echo(
            f"# processes: {run_config.inference.engines} {run_config.inference.backend} "
            f"engine(s), 1 gateway, {run.rollout_workers} rollout worker(s), "
            f"{run.train_workers} trainer rank(s); output {out}"
        )
        return
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    code = entry.run(run_config, out, resume=resume)
    if code:
        raise typer.Exit(code)
