"""The monitor's loop: records in from a :class:`Subscriber`, a redraw at most ``fps`` times a
second, only when something changed and once a burst of events is over, until the run ends (its
``end`` event), ``exit_after`` seconds pass, or ``stop`` is set."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from rich.console import Console
from rich.live import Live

from areal.cli.monitor.render import PanelRender, render
from areal.cli.monitor.source import Subscriber
from areal.cli.monitor.state import MonitorState

MAX_FPS = 4.0


def plugin_panels() -> dict[str, PanelRender]:
    """Panels registered with ``areal_register_monitor_panels``, by name."""
    from areal.core.plugins import registry

    return dict(registry("monitor_panels").entries)


def follow(
    subscriber: Subscriber,
    console: Console,
    *,
    state: MonitorState | None = None,
    panels: Mapping[str, PanelRender] | None = None,
    exit_after: float | None = None,
    stop: threading.Event | None = None,
    alive: Callable[[], bool] | None = None,
    fps: float = MAX_FPS,
) -> MonitorState:
    """Show the run live until it ends; returns the final state. ``alive`` (checked every few
    seconds) tells a run killed before its ``end`` event from a quiet one."""
    state = state or MonitorState()
    checked = time.monotonic()
    fps = min(fps, MAX_FPS)
    deadline = None if exit_after is None else time.monotonic() + exit_after
    drawn = -1
    last_draw = 0.0
    with Live(render(state, panels), console=console, auto_refresh=False) as live:
        while not _should_stop(state, deadline, stop):
            records = subscriber.poll(1.0 / fps)
            state.feed_all(records)
            now = time.monotonic()
            if alive is not None and now - checked >= 2.0:
                checked = now
                if not alive():
                    break
            # A step publishes a burst of events: draw once it is over (a quiet poll), or at
            # least every second while events keep coming, never above ``fps``.
            due = not records or now - last_draw >= 1.0
            if state.version != drawn and due and now - last_draw >= 1.0 / fps:
                live.update(render(state, panels), refresh=True)
                drawn, last_draw = state.version, now
        live.update(render(state, panels), refresh=True)
    return state


def collect(
    subscriber: Subscriber, state: MonitorState, *, timeout: float, quiet: float = 0.5
) -> MonitorState:
    """Take what arrives until ``quiet`` seconds pass without a record (the publisher's replay is
    over) or ``timeout`` seconds in all: ``areal monitor --once``."""
    deadline = time.monotonic() + timeout
    heard = False
    while (left := deadline - time.monotonic()) > 0:
        records = subscriber.poll(min(left, quiet if heard else left))
        if not records and heard:
            break
        heard = heard or bool(records)
        state.feed_all(records)
    return state


def _should_stop(state: MonitorState, deadline: float | None, stop: threading.Event | None) -> bool:
    if state.has("end"):
        return True
    if stop is not None and stop.is_set():
        return True
    return deadline is not None and time.monotonic() >= deadline
