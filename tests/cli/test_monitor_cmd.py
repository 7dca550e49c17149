"""``areal monitor`` end to end: a real publisher (the ``events`` sink) in the test replays a
recorded run over ZeroMQ, and the command subscribes (``--once``, or following the run until its
``end`` event); a finished run's directory is replayed from its metrics.jsonl; ``areal train``
draws the monitor only on a terminal and keeps its plain log lines otherwise.

A live run is played in step with the monitor: what comes after its subscription is published once
the publisher has sent the replay to it (``EventPublisher.sent``), never after a pause.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from areal.cli import train_cmd
from areal.cli.main import make_app
from areal.cli.monitor.source import read_records
from areal.plugins.metrics.events_pub import EventPublisher
from areal.plugins.metrics.jsonl import RESERVED
from support import eventually

SNAPSHOTS = Path(__file__).parent / "snapshots"
RECORDED = SNAPSHOTS / "quickstart_events.jsonl"
FINISHED = (SNAPSHOTS / "monitor_finished.txt").read_text(encoding="utf-8")

runner = CliRunner()
CEILING_S = 120  # --exit-after: a monitor that missed the end stops here, and the test fails


def play(pub: EventPublisher, records: list[dict[str, Any]]) -> None:
    for r in records:
        pub.write(r["event"], r["step"], {k: v for k, v in r.items() if k not in RESERVED})


def publish_recorded(pub_dir: Path | None) -> EventPublisher:
    """A publisher that has played the recorded run, with its recorded times."""
    records = read_records(RECORDED)
    times = iter(float(r["time"]) for r in records)
    pub = EventPublisher(pub_dir, clock=lambda: next(times))
    play(pub, records)
    return pub


def subscribed(pub: EventPublisher, before: int) -> None:
    """Returns once the ``before`` events sent before the monitor subscribed have gone out
    again, as the replay of its subscription: the monitor is watching."""
    eventually(lambda: pub.sent >= before, 60, f"the {before} events sent with no subscriber")
    eventually(lambda: pub.sent >= 2 * before, 60, "the monitor's subscription and replay")


def when_subscribed(pub: EventPublisher, before: int, then: Any) -> threading.Thread:
    """``then()`` on a thread, once the monitor is watching (:func:`subscribed`)."""

    def run() -> None:
        subscribed(pub, before)
        then()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_once_over_pub_sub_shows_what_the_file_replay_shows(tmp_path: Path) -> None:
    pub = publish_recorded(tmp_path)  # all published before anyone subscribed: a replay
    try:
        result = runner.invoke(make_app(), ["monitor", str(tmp_path), "--once", "--width", "100"])
    finally:
        pub.close()
    assert result.exit_code == 0, result.output
    assert result.stdout == FINISHED


def test_following_a_url_until_the_run_ends(tmp_path: Path) -> None:
    """Half the run before the monitor comes, the rest while it watches, up to the end event."""
    records = read_records(RECORDED)
    half = len(records) // 2
    times = iter(float(r["time"]) for r in records)
    pub = EventPublisher(None, clock=lambda: next(times))
    play(pub, records[:half])
    rest = when_subscribed(pub, half, lambda: play(pub, records[half:]))
    started = time.monotonic()
    try:
        args = ["monitor", pub.address, "--exit-after", str(CEILING_S), "--width", "100"]
        result = runner.invoke(make_app(), args)
    finally:
        rest.join(60)
        pub.close()
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started < CEILING_S  # it stopped at the run's end event
    assert result.stdout.rstrip("\n") == FINISHED.rstrip("\n")


def test_a_run_killed_before_its_end_event_stops_the_watch(tmp_path: Path) -> None:
    records = [r for r in read_records(RECORDED) if r["event"] != "end"]
    pub = EventPublisher(None)
    play(pub, records[:20])
    run = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    info = {"address": pub.address, "pid": run.pid, "run": pub.run_id}
    (tmp_path / "events.json").write_text(json.dumps(info))
    # Killed and reaped (gone) while the monitor watches.
    killer = when_subscribed(pub, 20, lambda: (run.kill(), run.wait()))
    started = time.monotonic()
    try:
        args = ["monitor", str(tmp_path), "--width", "100", "--exit-after", str(CEILING_S)]
        result = runner.invoke(make_app(), args)
    finally:
        killer.join(60)
        run.kill()
        run.wait()
        pub.close()
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started < CEILING_S  # it stopped when the run's process was gone
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
        if terminal:  # the run goes on until the monitor has subscribed and had its replay
            subscribed(pubs[-1], len(records))
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
