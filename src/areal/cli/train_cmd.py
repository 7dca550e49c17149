"""``areal train CONFIG``: one asynchronous RL run (engines, gateway, rollout workers, trainer).

Example: ``areal train configs/quickstart.yaml --set train.max_steps=5``. torch is imported only
when the run starts, so ``areal train --help`` and config errors stay fast. On a terminal the live
monitor (``areal monitor``'s view) is drawn below the log lines; otherwise the log lines are all.
"""

from __future__ import annotations

import logging
import shlex
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from areal.cli.errors import CLIError
from areal.core.config import ConfigError

if TYPE_CHECKING:
    from areal.core.run_config import RunConfig


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
    launcher: str | None = typer.Option(
        None,
        "--launcher",
        help="Where the processes run: local (default), ray, slurm, or a plugin's launcher; "
        "the same as --set launcher.name=NAME.",
    ),
    torchrun: str = typer.Option(
        "",
        "--torchrun",
        help="Extra torchrun flags when async.train_workers > 1, e.g. on node K (0 or 1) of 2: "
        "--torchrun '--nnodes 2 --node-rank K --rdzv-endpoint NODE0:29500' (node 0 runs rank 0).",
    ),
) -> None:
    """Train a policy by asynchronous RL on a run config.

    Example: [bold]areal train configs/quickstart.yaml --set train.max_steps=5[/bold]
    """
    from areal.run import train as entry
    from areal.run.model_scale import scale_warnings

    if launcher is not None:
        overrides = [*overrides, f"launcher.name={launcher}"]
    try:
        run_config = entry.load(str(config), overrides, str(agent_config) if agent_config else None)
    except ConfigError as err:
        raise CLIError(str(err)) from None
    out = output_dir or entry.default_output_dir(str(config))
    run_config = entry.with_log_dir(run_config, out)  # logging.log_dir unset: <out>/logs
    for warning in scale_warnings(run_config):
        typer.echo(f"warning: {warning}", err=True)
    if dry_run:
        from areal.cli.dry_run import launch_script, plan_lines

        try:
            plan = plan_lines(run_config, out)
        except ValueError as err:  # the launcher's options
            raise CLIError(str(err)) from None
        typer.echo(run_config.to_yaml())
        typer.echo("\n".join(plan))
        script = launch_script(run_config, out)
        if script is not None:
            where = Path(out) / "run"
            typer.echo(f"\n# the script `areal train` would submit (written to {where}):\n{script}")
        return
    names = run_config.logging.metric_sinks
    extra = shlex.split(torchrun)
    if _on_terminal() and (names is None or "events" in names):
        code = _run_with_monitor(run_config, out, resume, extra)
    else:
        logging.basicConfig(level="INFO", format=entry.LOG_FORMAT)
        code = entry.run(run_config, out, resume=resume, torchrun=extra)
    if code:
        raise typer.Exit(code)


def _on_terminal() -> bool:
    return sys.stdout.isatty()


def _run_with_monitor(run_config: RunConfig, out: Path, resume: bool, torchrun: list[str]) -> int:
    """The run, with the live monitor drawn by a thread subscribed to the run's own events (the
    same view as ``areal monitor``); log lines scroll above it."""
    from rich.console import Console
    from rich.logging import RichHandler

    from areal.cli.monitor import live, source
    from areal.run import train as entry

    console = Console()
    handler = RichHandler(console=console, show_path=False, log_time_format="%H:%M:%S")
    logging.basicConfig(level="INFO", format="%(name)s: %(message)s", handlers=[handler])
    log_dir = run_config.logging.directory(out)
    previous = (source.read_events_file(log_dir) or {}).get("run")
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():  # the run writes a fresh events.json once its sinks are up
            info = source.read_events_file(log_dir) or {}
            if info.get("run") not in (None, previous) and isinstance(info.get("address"), str):
                subscriber = source.Subscriber(info["address"])
                try:
                    live.follow(subscriber, console, panels=live.plugin_panels(), stop=stop)
                finally:
                    subscriber.close()
                return
            stop.wait(0.2)

    watcher = threading.Thread(target=watch, name="areal-monitor", daemon=True)
    watcher.start()
    try:
        return entry.run(run_config, out, resume=resume, torchrun=torchrun)
    finally:
        watcher.join(timeout=2.0)  # time to draw the run's ``end`` event
        stop.set()
        watcher.join(timeout=2.0)
