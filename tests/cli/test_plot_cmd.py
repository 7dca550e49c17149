"""``areal plot`` and ``python -m areal.tools.plot_metrics`` on a recorded metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from areal.cli.main import main, make_app
from areal.tools.plot_metrics import main as plot_main
from areal.tools.plot_metrics import read_series

runner = CliRunner()


def write_run(log_dir: Path, rewards: list[float]) -> Path:
    log_dir.mkdir(parents=True)
    with open(log_dir / "metrics.jsonl", "w") as f:
        for step, reward in enumerate(rewards, start=1):
            f.write(json.dumps({"event": "train", "step": step, "reward": reward, "loss": 0.1}))
            f.write("\n")
            f.write(json.dumps({"event": "rollout", "step": step, "tokens": 100 * step}) + "\n")
    return log_dir


def test_series_pick_the_event_and_key(tmp_path: Path) -> None:
    logs = write_run(tmp_path / "a", [0.2, 0.5, 0.9])
    assert read_series(logs, "reward") == ([1, 2, 3], [0.2, 0.5, 0.9])
    assert read_series(logs, "rollout/tokens") == ([1, 2, 3], [100.0, 200.0, 300.0])


def test_plot_overlays_runs_into_a_png(tmp_path: Path) -> None:
    a, b = write_run(tmp_path / "sync", [0.1, 0.2]), write_run(tmp_path / "async", [0.1, 0.6])
    out = tmp_path / "plots" / "reward.png"
    args = ["plot", "--log-dir", str(a), "--log-dir", str(b), "--metric", "reward", "-o", str(out)]
    result = runner.invoke(make_app(), [*args, "--label", "sync", "--label", "async"])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logs = write_run(tmp_path / "a", [0.1])
    assert main(["plot", "--log-dir", str(logs), "--metric", "nope", "-o", "x.png"]) == 1
    assert capsys.readouterr().err == f"error: no 'nope' values in {logs}\n"
    assert (
        plot_main(["--log-dir", str(tmp_path / "missing"), "--metric", "loss", "--output", "x.png"])
        == 1
    )
