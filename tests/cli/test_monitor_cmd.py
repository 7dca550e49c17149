"""``areal monitor`` end to end: a real publisher (the ``events`` sink) in the test replays a
recorded run over ZeroMQ, and the command subscribes (``--once``, or following the run until its
``end`` event); a finished run's directory is replayed from its metrics.jsonl; ``areal train``
draws the monitor only on a terminal and keeps its plain log lines otherwise."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from areal.cli import train_cmd
from areal.cli.main import make_app
from areal.cli.monitor.source import read_records
from areal.plugins.metrics.events_pub import EventPublisher
from areal.plugins.metrics.jsonl import RESERVED

SNAPSHOTS = Path(__file__).parent / "snapshots"
RECORDED = SNAPSHOTS / "quickstart_events.jsonl"
FINISHED = (SNAPSHOTS / "monitor_finished.txt").read_text(encoding="utf-8")

runner = CliRunner()


def publish_recorded(pub_dir: Path | None, *, pause: float = 0.0) -> EventPublisher:
    """A publisher replaying the recorded run with its recorded times (``pause`` s apart)."""
    records = read_records(RECORDED)
    times = iter(float(r["time"]) for r in records)
    pub = EventPublisher(pub_dir, clock=lambda: next(times))

    def play() -> None:
        for r in records:
            values = {k: v for k, v in r.items() if k not in RESERVED}
            pub.write(r["event"], r["step"], values)
            time.sleep(pause)

    if pause:
        threading.Thread(target=play, daemon=True).start()
    else:
        play()
    return pub


def test_once_over_pub_sub_shows_what_the_file_replay_shows(tmp_path: Path) -> None:
    pub = publish_recorded(tmp_path)  # all published before anyone subscribed: a replay
    try:
        result = runner.invoke(make_app(), ["monitor", str(tmp_path), "--once", "--width", "100"])
    finally:
        pub.close()
    assert result.exit_code == 0, result.output
    assert result.stdout == FINISHED


def test_following_a_url_until_the_run_ends(tmp_path: Path) -> None:
    pub = publish_recorded(None, pause=0.01)
    started = time.monotonic()
    try:
        args = ["monitor", pub.address, "--exit-after", "20", "--width", "100"]
        result = runner.invoke(make_app(), args)
    finally:
        pub.close()
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started < 15  # it stopped at the run's end event
    assert result.stdout.rstrip("\n") == FINISHED.rstrip("\n")


def test_a_run_killed_before_its_end_event_stops_the_watch(tmp_path: Path) -> None:
    records = [r for r in read_records(RECORDED) if r["event"] != "end"]
    pub = EventPublisher(None)
    for r in records[:20]:
        pub.write(r["event"], r["step"], {k: v for k, v in r.items() if k not in RESERVED})
    run = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    info = {"address": pub.address, "pid": run.pid, "run": pub.run_id}
    (tmp_path / "events.json").write_text(json.dumps(info))
    threading.Timer(1.0, lambda: (run.kill(), run.wait())).start()  # killed, reaped: gone
    started = time.monotonic()
    try:
        result = runner.invoke(make_app(), ["monitor", str(tmp_path), "--width", "100"])
    finally:
        run.kill()
        run.wait()
        pub.close()
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started < 10
    assert "running" in result.stdout.splitlines()[0]  # no end event came: it never finished


def test_a_finished_run_dir_is_replayed_from_metrics_jsonl(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    shutil.copy(RECORDED, logs / "metrics.jsonl")
    # A crashed run's events.json (its process is gone) does not fool the monitor.
    (logs / "events.json").write_text('{"address": "tcp://127.0.0.1:9", "pid": 999999999}')
    result = runner.invoke(make_app(), ["monitor", str(tmp_path), "--width", "100"])
    assert result.exit_code == 0, result.output
    assert result.stdout == FINISHED


def test_json_gives_scripts_what_the_panels_show(tmp_path: Path) -> None:
    """The same numbers over PUB/SUB and from the file, computed from the recorded events."""
    records = read_records(RECORDED)
    trains = [r for r in records if r["event"] == "train"]
    pub = publish_recorded(tmp_path)
    try:
        live = runner.invoke(make_app(), ["monitor", str(tmp_path), "--json"])
    finally:
        pub.close()
    (tmp_path / "replay").mkdir()
    shutil.copy(RECORDED, tmp_path / "replay" / "metrics.jsonl")
    replay = runner.invoke(make_app(), ["monitor", str(tmp_path / "replay"), "--json"])
    assert live.exit_code == replay.exit_code == 0, live.output + replay.output
    data = json.loads(live.stdout)
    assert data == json.loads(replay.stdout)
    assert data["records"] == len(records)
    assert data["latest"]["train"]["step"] == trains[-1]["step"]
    assert data["elapsed_s"] == round(records[-1]["time"] - records[0]["time"], 3)
    hist = [r["staleness_hist"] for r in records if r["event"] == "rollout"]
    total = sum(int(c) for h in hist for c in h.split(","))
    assert sum(data["staleness_on_arrival"]) == total


def test_nothing_to_watch_is_one_line(tmp_path: Path) -> None:
    result = runner.invoke(make_app(), ["monitor", str(tmp_path / "nope")])
    assert result.exit_code != 0 and "no such run directory" in str(result.exception)
    result = runner.invoke(make_app(), ["monitor", str(tmp_path)])
    assert "metrics.jsonl of a finished one" in str(result.exception)
    args = ["monitor", "tcp://127.0.0.1:9", "--once", "--exit-after", "0.3"]
    result = runner.invoke(make_app(), args)
    assert "no events from tcp://127.0.0.1:9" in str(result.exception)


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "terminal"])
def test_train_shows_the_monitor_only_on_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, terminal: bool
) -> None:
    import areal.run.train

    log_dir = tmp_path / "logs"
    pubs: list[EventPublisher] = []
    records = read_records(RECORDED)

    def run(config: object, out: Path, *, resume: bool = False, torchrun: object = ()) -> int:
        logging.getLogger("areal.train").info("run started")
        pubs.append(publish_recorded(log_dir))
        # The run goes on until the monitor has subscribed: every event was sent once with nobody
        # listening, then once more as the replay to the monitor's subscription.
        deadline, replayed = time.monotonic() + (60 if terminal else 0), 2 * len(records)
        while pubs[-1].sent < replayed and time.monotonic() < deadline:
            time.sleep(0.05)
        pubs[-1].close()
        return 0

    monkeypatch.setattr(areal.run.train, "run", run)
    monkeypatch.setattr(train_cmd, "_on_terminal", lambda: terminal)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # basicConfig runs again
    args = ["train", "configs/quickstart.yaml", "--set", f"logging.log_dir={log_dir}"]
    result = runner.invoke(make_app(), args)
    assert result.exit_code == 0, result.output
    if terminal:
        assert "finished (max_steps)" in result.stdout and "staleness" in result.stdout
    else:
        assert "areal step" not in result.output and "╭" not in result.output
        assert "INFO areal.train: run started" in result.output  # the plain log line
