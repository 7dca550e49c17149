"""The live monitor's picture: a pure function of a :class:`MonitorState` (and plugin panels).

Built-in panels first (two per row; registered through ``areal_register_monitor_panels`` too, by
``areal.cli.monitor.register``), then each plugin panel registered with that hook; a plugin panel
that raises becomes a one-line error panel, so a broken plugin never takes the monitor down. Numbers come from the run's events only, so the same
recorded stream always renders the same text (``tests/cli/snapshots/``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from areal.cli.monitor.state import MonitorState, as_float

PanelRender = Callable[[MonitorState], RenderableType]

SPARKS = "▁▂▃▄▅▆▇█"
BAR_WIDTH = 24


def render(state: MonitorState, panels: Mapping[str, PanelRender] | None = None) -> Group:
    """The whole monitor: header, built-in panels (two per row), then the other registered
    panels in registration order. ``panels`` may hold the built-ins too (the registry does:
    ``areal.cli.monitor.register`` registers them); they are drawn once, in the grid."""
    grid = Table.grid(expand=True)
    grid.add_column(ratio=1)
    grid.add_column(ratio=1)
    own = built_in_panels()
    built_in = [fn(state) for fn in own.values()]
    for left, right in zip(built_in[::2], built_in[1::2], strict=True):
        grid.add_row(left, right)
    extra = [
        plugin_panel(name, fn, state)
        for name, fn in (panels or {}).items()
        if own.get(name) is not fn
    ]
    return Group(header(state), grid, *extra)


def built_in_panels() -> dict[str, PanelRender]:
    """The monitor's own panels by name, in grid order (registered like a plugin's)."""
    return {
        "steps": steps_panel,
        "staleness": staleness_panel,
        "workers": workers_panel,
        "queue": queue_panel,
        "throughput": throughput_panel,
        "curves": curves_panel,
        "sync": sync_panel,
        "problems": problems_panel,
    }


def plugin_panel(name: str, fn: PanelRender, state: MonitorState) -> RenderableType:
    """A plugin's panel, or one line saying how it failed."""
    try:
        return fn(state)
    except Exception as exc:
        line = Text(f"panel {name!r} failed: {type(exc).__name__}: {exc}", style="red")
        return Panel(line, title=name, border_style="red")


# --- the header ----------------------------------------------------------------------------------


def header(state: MonitorState) -> Text:
    run, train = state.latest("run"), state.latest("train")
    step = int(as_float(train.get("step")) or 0)
    max_steps = int(as_float(run.get("max_steps")) or 0)
    text = Text("areal ", style="bold")
    if max_steps:
        text.append(f"step {step}/{max_steps} ")
        text.append(bar(step / max_steps, BAR_WIDTH), style="green")
        text.append(f" {100 * step / max_steps:.0f}%")
    else:
        text.append(f"step {step}")
    eta = state.eta()
    text.append(f"  elapsed {duration(state.elapsed())}")
    text.append(f"  ETA {duration(eta) if eta is not None else '?'}")
    if run.get("loss"):  # runs recorded before the run event named its loss have none
        text.append(f"  loss {run['loss']}")
    text.append("  ")
    text.append(*status(state))
    return text


def status(state: MonitorState) -> tuple[str, str]:
    end = state.latest("end")
    if not end:
        return ("running" if state.records else "waiting for events", "cyan")
    if end.get("error"):
        return (f"failed: {end['error']}", "bold red")
    return (f"finished ({end.get('stopped_by', '?')})", "bold green")


# --- built-in panels -----------------------------------------------------------------------------


def steps_panel(state: MonitorState) -> Panel:
    rollout, train = state.latest("rollout"), state.latest("train")
    table = _Rows()
    table.add_row("rollout", f"step {_int(rollout, 'step')}", f"version {_int(rollout, 'version')}")
    table.add_row("train", f"step {_int(train, 'step')}", f"version {_int(train, 'version')}")
    ahead = int(as_float(rollout.get("step")) or 0) - int(as_float(train.get("step")) or 0)
    table.add_row("ahead", f"{ahead} batch(es)", "")
    return Panel(table, title="steps")


def staleness_panel(state: MonitorState) -> Panel:
    threshold = as_float(state.latest("run").get("staleness_threshold"))
    lags = state.series("train", "max_staleness")
    table = _Rows()
    total = sum(state.staleness) or 1
    for lag, count in enumerate(state.staleness):
        over = threshold is not None and lag > threshold
        label = Text(f"{lag}", style="red" if over else "")
        table.add_row(
            label, Text(bar(count / total, 16), style="red" if over else "blue"), f"{count}"
        )
    limit = f"{threshold:g}" if threshold is not None else "?"
    last = f"{lags[-1]:g}" if lags else "-"
    worst = f"{max(lags):g}" if lags else "-"
    table.add_row("max lag", f"{last} (worst {worst})", f"/ {limit}")
    return Panel(table, title="staleness (samples on arrival)")


def workers_panel(state: MonitorState) -> Panel:
    table = _Rows()
    table.add_row(
        Text("worker", style="bold"),
        Text("in flight", style="bold"),
        Text("episodes", style="bold"),
    )
    for name, running, episodes in state.workers():
        table.add_row(name, f"{running}", f"{episodes}")
    acc = state.latest("accounting")
    table.add_row(
        "all", f"{_int(acc, 'episodes_running')}", f"{_int(acc, 'trajectories_received')}"
    )
    if "sessions_waiting" in acc:  # runs recorded before it was counted have no row
        waiting = _int(acc, "sessions_waiting")
        style = "" if waiting in ("0", "-") else "yellow"
        table.add_row("waiting", Text(waiting, style=style), "for the staleness budget")
    return Panel(table, title="rollout workers")


def queue_panel(state: MonitorState) -> Panel:
    acc, run = state.latest("accounting"), state.latest("run")
    depth = as_float(acc.get("trajectories_queued")) or 0.0
    limit = as_float(run.get("queue_max_size"))
    table = _Rows()
    fill = depth / limit if limit else 0.0
    style = "red" if fill >= 1 else "yellow" if fill >= 0.8 else "green"
    table.add_row(
        "depth",
        f"{depth:g} / {limit:g}" if limit else f"{depth:g}",
        Text(bar(fill, 12), style=style),
    )
    full = as_float(acc.get("queue_full_seconds")) or 0.0
    table.add_row("back-pressure", f"{full:.1f} s full", "")
    table.add_row("buffered", f"{_int(acc, 'samples_buffered')} samples", "")
    return Panel(table, title="trajectory queue")


def throughput_panel(state: MonitorState) -> Panel:
    table = _Rows()
    table.add_row(
        Text("", style="bold"), Text("samples/s", style="bold"), Text("tokens/s", style="bold")
    )
    table.add_row(
        "rollout",
        _rate(state.rate("rollout", "generated")),
        _rate(state.rate("rollout", "tokens")),
    )
    table.add_row(
        "train",
        _rate(state.rate("train", "updated")),
        _rate(state.rate_of_total("accounting", "tokens_trained")),
    )
    return Panel(table, title="throughput")


def curves_panel(state: MonitorState) -> Panel:
    table = _Rows()
    for label, event, key in (
        ("reward", "train", "reward"),
        ("task success", "train", "success"),
        ("rollout reward", "rollout", "reward"),
        ("loss", "train", "loss"),
    ):
        values = state.series(event, key)
        if key == "success" and not values:
            continue  # the run has no success rule (dataset.success_reward)
        last = f"{values[-1]:.3f}" if values else "-"
        table.add_row(label, sparkline(values[-30:]), last)
    return Panel(table, title="reward and loss")


def sync_panel(state: MonitorState) -> Panel:
    sync = state.latest("sync")
    table = _Rows()
    if not sync:
        table.add_row("no weight sync yet", "", "")
        return Panel(table, title="last weight sync")
    # Overlapped (async.overlap_sync): the step waited only for the save.
    beside = "beside the next step" if as_float(sync.get("overlapped")) else ""
    table.add_row(
        f"version {_int(sync, 'version')}", f"{as_float(sync.get('seconds')) or 0:.3f} s", beside
    )
    for phase in ("save", "pause", "update", "continue"):
        seconds = as_float(sync.get(f"{phase}_seconds"))
        if seconds is not None:
            table.add_row(f"  {phase}", f"{seconds:.3f} s", "")
    return Panel(table, title="last weight sync")


def problems_panel(state: MonitorState) -> Panel:
    train, acc = state.latest("train"), state.latest("accounting")
    table = _Rows()
    rows: Sequence[tuple[str, Mapping[str, Any], str]] = (
        ("stale samples dropped", train, "dropped_stale"),
        ("empty samples dropped", train, "dropped_empty"),
        ("late samples dropped", train, "dropped_late"),
        ("episodes dropped whole", train, "dropped_trajectories"),
        ("episodes discarded", acc, "episodes_discarded"),
        ("sessions expired", acc, "sessions_expired"),
        ("process restarts", acc, "restarts"),
    )
    for label, record, key in rows:
        value = int(as_float(record.get(key)) or 0)
        table.add_row(label, Text(f"{value}", style="red" if value else ""))
    end = state.latest("end")
    if end.get("error"):
        table.add_row("error", Text(str(end["error"]), style="red"))
    return Panel(table, title="errors and drops")


# --- small pieces --------------------------------------------------------------------------------


def bar(fraction: float, width: int) -> str:
    """``█████░░░``: ``fraction`` (clamped to 0..1) of ``width`` cells."""
    if not math.isfinite(fraction):
        fraction = 0.0
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return "█" * filled + "░" * (width - filled)


def sparkline(values: Sequence[float]) -> str:
    """One block character per value, scaled between the values' min and max."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return ""
    low, high = min(finite), max(finite)
    span = high - low
    out = []
    for v in values:
        if not math.isfinite(v):
            out.append("!")
        else:
            level = 0 if span == 0 else round((v - low) / span * (len(SPARKS) - 1))
            out.append(SPARKS[level])
    return "".join(out)


def duration(seconds: float) -> str:
    """``1:02:03``."""
    seconds = max(0, round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class _Rows:
    """A few left-aligned columns, one space apart, drawn as a single Text: a rich Table measures
    its cells again on every frame, which made a frame several times dearer."""

    def __init__(self) -> None:
        self.rows: list[list[Text]] = []

    def add_row(self, *cells: str | Text) -> None:
        self.rows.append([c if isinstance(c, Text) else Text(c) for c in cells])

    def __rich__(self) -> Text:
        columns = max((len(r) for r in self.rows), default=0)
        widths = [max(r[i].cell_len for r in self.rows if len(r) > i) for i in range(columns)]
        out = Text(no_wrap=True, overflow="ellipsis")
        for n, row in enumerate(self.rows):
            if n:
                out.append("\n")
            for i, cell in enumerate(row):
                out.append_text(cell)
                if i < len(row) - 1:
                    out.append(" " * (widths[i] - cell.cell_len + 1))
        return out


def _int(record: Mapping[str, Any], key: str) -> str:
    value = as_float(record.get(key))
    return "-" if value is None else f"{int(value)}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
