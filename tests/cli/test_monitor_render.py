"""The live monitor rendered from a recorded event stream (a real ``areal train`` run's
``metrics.jsonl``, 12 steps of configs/quickstart.yaml), compared with a stored text snapshot;
plugin panels through ``areal_register_monitor_panels``; the state's derived numbers.

Regenerate the snapshots after an intended change of the picture:
``AREAL_UPDATE_SNAPSHOTS=1 .venv/bin/pytest tests/cli/test_monitor_render.py`` (then read the diff).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pluggy
import pytest
from rich.console import Console, RenderableType
from rich.panel import Panel

from areal.cli.monitor.render import (
    curves_panel,
    header,
    render,
    sparkline,
    sync_panel,
    workers_panel,
)
from areal.cli.monitor.source import read_records
from areal.cli.monitor.state import MonitorState
from areal.core import hookspecs
from areal.core.hookspecs import hookimpl
from areal.core.plugins import registry

SNAPSHOTS = Path(__file__).parent / "snapshots"
RECORDED = SNAPSHOTS / "quickstart_events.jsonl"
WIDTH = 100


def text_of(renderable: RenderableType, width: int = WIDTH) -> str:
    console = Console(record=True, width=width, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def check_snapshot(name: str, text: str) -> None:
    path = SNAPSHOTS / name
    if os.environ.get("AREAL_UPDATE_SNAPSHOTS"):
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"{name} changed; see the module docstring"


def recorded_state(until_step: int | None = None) -> MonitorState:
    state = MonitorState()
    for record in read_records(RECORDED):
        if until_step is not None and record["event"] == "train" and record["step"] > until_step:
            break
        state.feed(record)
    return state


def test_a_finished_run_renders_as_its_snapshot() -> None:
    check_snapshot("monitor_finished.txt", text_of(render(recorded_state())))


def test_a_run_in_progress_renders_as_its_snapshot() -> None:
    text = text_of(render(recorded_state(until_step=6)))
    check_snapshot("monitor_step6.txt", text)
    assert "step 6/12" in text and "running" in text


def test_the_picture_agrees_with_the_recorded_numbers() -> None:
    records = read_records(RECORDED)
    train = [r for r in records if r["event"] == "train"]
    text = text_of(render(recorded_state()))
    assert f"step {train[-1]['step']}/12" in text and "finished (max_steps)" in text
    assert f"{train[-1]['loss']:.3f}" in text  # the loss sparkline ends with the newest loss
    dropped = train[-1]["dropped_stale"]
    assert f"stale samples dropped  {dropped}" in text


class _Panels:
    """A plugin with a good panel and a broken one."""

    @hookimpl
    def areal_register_monitor_panels(self, register: Any) -> None:
        register("steps-left", self.steps_left)
        register("broken", self.broken)

    def steps_left(self, view: MonitorState) -> RenderableType:
        left = view.latest("run")["max_steps"] - view.latest("train")["step"]
        losses = view.series("train", "loss")
        return Panel(f"{left} steps left, {len(losses)} losses seen", title="steps-left")

    def broken(self, view: MonitorState) -> RenderableType:
        raise KeyError("no such event")


def test_plugin_panels_render_below_and_a_broken_one_is_one_line() -> None:
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    pm.register(_Panels(), name="panels")
    panels = registry("monitor_panels", pm).entries
    assert sorted(panels) == ["broken", "steps-left"]
    text = text_of(render(recorded_state(until_step=6), panels))
    assert "6 steps left, 6 losses seen" in text
    errors = [line for line in text.splitlines() if "failed" in line]
    assert [e.strip("│ ") for e in errors] == ["panel 'broken' failed: KeyError: 'no such event'"]
    assert text.index("errors and drops") < text.index("steps-left") < text.index("broken")


def test_the_header_names_the_loss_when_the_run_event_has_one() -> None:
    state = MonitorState()
    state.feed({"event": "run", "step": 0, "time": 100.0, "max_steps": 10})
    assert "loss" not in header(state).plain  # a run recorded before the event named it
    state.feed({"event": "run", "step": 0, "time": 101.0, "max_steps": 10, "loss": "sapo"})
    assert "  loss sapo  " in header(state).plain


def test_the_weight_sync_panel_says_when_the_engines_loaded_beside_the_next_step() -> None:
    state = MonitorState()
    sync = {"event": "sync", "step": 3, "time": 1.0, "version": 3, "seconds": 0.07}
    state.feed({**sync, "save_seconds": 0.01, "overlapped": 0})
    assert "beside the next step" not in text_of(sync_panel(state))
    state.feed({**sync, "step": 4, "version": 4, "save_seconds": 0.01, "overlapped": 1})
    row = next(line for line in text_of(sync_panel(state)).splitlines() if "version 4" in line)
    assert "0.070 s" in row and "beside the next step" in row


def test_the_workers_panel_counts_the_polls_the_staleness_budget_holds() -> None:
    """Rollout workers held back (their long polls for a slot) when the run counts them; a run
    recorded before it did shows no row."""
    state = MonitorState()
    accounting = {"event": "accounting", "step": 1, "time": 1.0, "episodes_running": 8}
    state.feed({**accounting, "rollout0_running": 8, "rollout0_episodes": 40})
    assert "waiting" not in text_of(workers_panel(state))
    state.feed({**accounting, "step": 2, "time": 2.0, "sessions_waiting": 3})
    row = next(line for line in text_of(workers_panel(state)).splitlines() if "waiting" in line)
    assert "3" in row and "for the staleness budget" in row


def test_task_success_is_a_curve_when_the_run_reports_it() -> None:
    state = MonitorState()
    state.feed({"event": "train", "step": 1, "time": 1.0, "reward": 0.5, "loss": 0.1})
    assert "task success" not in text_of(curves_panel(state))  # no success rule: no row
    state.feed({"event": "train", "step": 2, "time": 2.0, "reward": 0.5, "success": 0.25})
    row = next(line for line in text_of(curves_panel(state)).splitlines() if "task success" in line)
    assert "0.250" in row


def test_rates_eta_and_series_come_from_event_times() -> None:
    state = MonitorState()
    state.feed({"event": "run", "step": 0, "time": 100.0, "max_steps": 10})
    for step in range(1, 5):  # one step every 2 s, 8 samples each
        state.feed({"event": "train", "step": step, "time": 100.0 + 2 * step, "updated": 8})
    assert state.rate("train", "updated") == pytest.approx(24 / 6)
    assert state.eta() == pytest.approx(6 * 2.0)
    assert state.series("train", "step") == [1.0, 2.0, 3.0, 4.0]
    assert state.elapsed() == 8.0
    # An older record arriving late (a replay) never replaces the newest one.
    state.feed({"event": "train", "step": 2, "time": 104.0, "updated": 8})
    assert state.latest("train")["step"] == 4
    # Records without a name or time are ignored rather than breaking the view.
    state.feed({"step": 3})
    state.feed({"event": "train", "time": "soon"})
    assert state.records == 6


def test_sparkline_scales_between_min_and_max() -> None:
    assert sparkline([0.0, 0.5, 1.0]) == "▁▅█"
    assert sparkline([2.0, 2.0]) == "▁▁"
    assert sparkline([0.0, float("nan"), 1.0]) == "▁!█"
    assert sparkline([]) == ""
