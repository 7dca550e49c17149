"""``areal plot``: metrics of one or more runs as a PNG/SVG/PDF (matplotlib, headless).

The same as the seed's ``python -m areal.tools.plot_metrics``; runs given twice are overlaid
(e.g. a sync and an async run).
"""

from __future__ import annotations

from pathlib import Path

import typer

from areal.cli.errors import CLIError


def plot_command(
    log_dirs: list[Path] = typer.Option(
        ..., "--log-dir", help="A run's log dir (repeat to overlay runs)."
    ),
    metrics: list[str] = typer.Option(
        ..., "--metric", help="A train-event key (loss, reward) or event/key (rollout/tokens)."
    ),
    output: Path = typer.Option(..., "--output", "-o", help="Image file: .png, .svg or .pdf."),
    labels: list[str] = typer.Option([], "--label", help="Legend label per --log-dir."),
    title: str | None = typer.Option(None, "--title", help="Figure title."),
) -> None:
    """Plot run metrics from metrics.jsonl.

    Example: [bold]areal plot --log-dir runs/quickstart/logs --metric reward --metric loss -o plot.png[/bold]
    """
    from areal.tools.plot_metrics import plot

    if labels and len(labels) != len(log_dirs):
        raise CLIError("give one --label per --log-dir")
    try:
        path = plot(log_dirs, metrics, output, labels=labels or None, title=title)
    except (FileNotFoundError, ValueError) as err:
        raise CLIError(str(err)) from None
    typer.echo(str(path))
