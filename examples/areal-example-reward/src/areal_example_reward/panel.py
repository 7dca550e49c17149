"""The ``reward-trend`` monitor panel: is the reward still climbing?

It reads only the monitor's view protocol (``view.latest(event) -> dict``,
``view.series(event, key) -> list[float]``), so it works with any monitor that offers it and is
tested with a ten-line fake. It is called on every refresh: cheap, and never raises on a run that
has not produced a rollout yet.
"""

from __future__ import annotations

from typing import Any, Protocol

from rich.panel import Panel
from rich.table import Table

BARS = "▁▂▃▄▅▆▇█"
WIDTH = 40  # newest points shown in the sparkline
WINDOW = 10  # points in each of the two averages compared for the trend


class MonitorView(Protocol):
    """The part of the monitor's state a panel may read."""

    def latest(self, event: str) -> dict[str, Any]: ...

    def series(self, event: str, key: str) -> list[float]: ...


def sparkline(values: list[float], width: int = WIDTH) -> str:
    """The newest ``width`` values as block characters, scaled between their min and max."""
    points = values[-width:]
    if not points:
        return ""
    low, high = min(points), max(points)
    span = high - low
    if span == 0:
        return BARS[len(BARS) // 2] * len(points)
    return "".join(BARS[round((v - low) / span * (len(BARS) - 1))] for v in points)


def trend(values: list[float], window: int = WINDOW) -> float | None:
    """Mean of the newest ``window`` values minus the mean of the ``window`` before them."""
    if len(values) < 2 * window:
        return None
    recent, before = values[-window:], values[-2 * window : -window]
    return sum(recent) / window - sum(before) / window


def render_reward_trend(view: MonitorView) -> Panel:
    """Latest rollout reward, best so far, trend over the last rollouts, and a sparkline."""
    rewards = view.series("rollout", "reward")
    if not rewards:
        return Panel("waiting for the first rollout…", title="reward trend")
    latest = view.latest("rollout").get("reward")
    if not isinstance(latest, (int, float)):
        latest = rewards[-1]
    change = trend(rewards)
    table = Table.grid(padding=(0, 2))
    table.add_row("latest", f"{float(latest):.3f}", "best", f"{max(rewards):.3f}")
    arrow = "-" if change is None else f"{'▲' if change >= 0 else '▼'} {change:+.3f}"
    table.add_row("trend", arrow, "rollouts", str(len(rewards)))
    table.add_row("", sparkline(rewards))
    return Panel(table, title="reward trend")
