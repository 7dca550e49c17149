"""``areal monitor [RUN_DIR|URL]``: the live view of a running run, or the summary of a finished one.

Example: ``areal monitor runs/quickstart/logs``. Fed by the events the run publishes on ZeroMQ
(the ``events`` metric sink), or, for a finished run, by its ``metrics.jsonl``; never by parsing
``train.log``.
"""

from __future__ import annotations

import json

import typer

from areal.cli.errors import CLIError


def monitor_command(
    target: str = typer.Argument(
        "runs/quickstart/logs",
        help="A run's log dir (or its output dir), or the publisher's URL (tcp://127.0.0.1:PORT).",
    ),
    once: bool = typer.Option(
        False, "--once", help="Print one picture of what the run has published so far, then exit."
    ),
    exit_after: float | None = typer.Option(
        None, "--exit-after", help="Stop watching after this many seconds.", min=0
    ),
    width: int | None = typer.Option(None, "--width", help="Columns (default: the terminal's)."),
    as_json: bool = typer.Option(
        False, "--json", help="Print what the panels show as JSON, once (implies --once)."
    ),
) -> None:
    """Watch a training run: steps, staleness, queue, throughput, reward and loss, weight syncs.

    Example: [bold]areal monitor runs/quickstart/logs[/bold]
    """
    from rich.console import Console

    from areal.cli.monitor import live, source
    from areal.cli.monitor.render import render
    from areal.cli.monitor.state import MonitorState

    where = source.resolve(target)
    console = Console(width=width)
    panels = live.plugin_panels()
    state = MonitorState()

    def show() -> None:
        if as_json:
            typer.echo(json.dumps(state.summary(), indent=2, default=str))
        else:
            console.print(render(state, panels))

    if where.replay is not None:
        state.feed_all(source.read_records(where.replay))
        show()
        return
    assert where.address is not None
    subscriber = source.Subscriber(where.address)
    try:
        if once or as_json:
            live.collect(subscriber, state, timeout=exit_after if exit_after is not None else 5.0)
            if not state.records:
                raise CLIError(f"no events from {where.address} (is the run still going?)")
            show()
        else:
            pid = where.pid
            alive = (lambda: source.pid_alive(pid)) if pid is not None else None
            live.follow(
                subscriber,
                console,
                state=state,
                panels=panels,
                exit_after=exit_after,
                alive=alive,
            )
    finally:
        subscriber.close()
