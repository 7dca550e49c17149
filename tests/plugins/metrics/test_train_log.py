"""train.log: the seed article's exact line shapes, throughput windows, append and threads."""

from __future__ import annotations

import re
import threading
from datetime import datetime
from pathlib import Path

import pytest

from areal.core.metrics import MetricValue, make_metric_sink
from areal.plugins.metrics.train_log import (
    TrainLogSink,
    format_line,
    format_ts,
    format_value,
    train_log_sink,
)
from support.clock import FakeClock

ROLLOUT = re.compile(r"^\[rollout\] step=\d+ generated=\d+ tokens=\d+ ts=\d\d:\d\d:\d\d\.\d{3}$")
TRAIN = re.compile(r"^\[train\] step=\d+ updated=\d+ loss=-?\d+\.\d{3} ts=\d\d:\d\d:\d\d\.\d{3}$")
THROUGHPUT = re.compile(
    r"^\[throughput\] samples_per_second=[\d.]+ tokens_per_second=[\d.]+ ts=\d\d:\d\d:\d\d\.\d{3}$"
)


def at(h: int, m: int, s: int, ms: int) -> float:
    """Unix time of a local wall-clock moment (format_ts prints local time)."""
    return datetime(2025, 3, 14, h, m, s, ms * 1000).timestamp()


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_the_seed_lines_exactly(tmp_path: Path) -> None:
    clock = FakeClock(at(14, 23, 0, 0))
    sink = TrainLogSink(tmp_path, clock=clock, throughput_interval=3600)
    clock.advance(at(14, 23, 1, 221) - clock())
    # keys out of order on purpose: the seed's order is restored
    sink.write("rollout", 120, {"tokens": 18420, "generated": 32})
    clock.advance(at(14, 23, 1, 335) - clock())
    sink.write("train", 118, {"updated": 32, "loss": 0.4213})
    sink.close()
    got = lines(tmp_path / "train.log")
    assert got == [
        "[rollout] step=120 generated=32 tokens=18420 ts=14:23:01.221",
        "[train] step=118 updated=32 loss=0.421 ts=14:23:01.335",
    ]
    assert ROLLOUT.match(got[0]) and TRAIN.match(got[1])


def test_other_events_and_value_formats() -> None:
    t = at(9, 5, 7, 9)
    line = format_line(
        "eval", 3, {"reward": 0.5, "note": "two words", "lr": 3e-05, "ok": True, "n": 7}, t
    )
    assert line == '[eval] step=3 reward=0.5 note="two words" lr=3e-05 ok=true n=7 ts=09:05:07.009'
    assert format_value("loss", 0.4) == "0.400"
    assert format_value("policy_loss", -1.23456) == "-1.235"
    assert format_value("x", 1842.0) == "1842.0"
    assert format_value("x", 3.14159) == "3.142"
    assert format_value("x", 0.0) == "0.0"
    assert format_value("loss", float("nan")) == "nan"
    assert format_value("name", "") == '""'
    # The run event's loss is a name, not a number: written as is.
    run = format_line("run", 0, {"loss": "sapo", "max_steps": 2}, t)
    assert run == "[run] step=0 loss=sapo max_steps=2 ts=09:05:07.009"
    assert format_ts(at(23, 59, 59, 999) + 0.0004) == "23:59:59.999"


def test_throughput_from_a_synthetic_stream(tmp_path: Path) -> None:
    """Window of 10 s from sink creation at t0; hand-computed rates below."""
    t0 = at(12, 0, 0, 0)
    clock = FakeClock(t0)
    sink = TrainLogSink(tmp_path, clock=clock, throughput_interval=10.0)
    events: list[tuple[float, str, int, dict[str, MetricValue]]] = [
        (2.0, "rollout", 1, {"generated": 8, "tokens": 4000}),
        (4.0, "train", 1, {"updated": 8, "loss": 0.5}),
        (6.0, "eval", 1, {"reward": 0.25}),  # other events do not count nor close the window
        (9.0, "rollout", 2, {"generated": 8, "tokens": 6000}),
        (12.5, "train", 2, {"updated": 8, "loss": 0.25}),  # closes window 1: 12.5 s long
        (15.0, "rollout", 3, {"generated": 8, "tokens": 5000}),
        (22.0, "train", 3, {"updated": 16, "loss": 0.125}),  # 9.5 s after: window stays open
        (22.5, "train", 4, {"updated": 4, "loss": 0.1}),  # closes window 2: 10 s long
    ]
    for dt, event, step, values in events:
        clock.advance(t0 + dt - clock())
        sink.write(event, step, values)
    sink.close()
    got = lines(tmp_path / "train.log")
    throughput = [line for line in got if line.startswith("[throughput]")]
    # window 1: 16 samples trained, 10000 tokens generated over 12.5 s
    # window 2: 20 samples, 5000 tokens over 10 s
    assert throughput == [
        "[throughput] samples_per_second=1.28 tokens_per_second=800.0 ts=12:00:12.500",
        "[throughput] samples_per_second=2.0 tokens_per_second=500.0 ts=12:00:22.500",
    ]
    assert all(THROUGHPUT.match(line) for line in throughput)
    # each throughput line follows the event that closed its window
    assert got.index(throughput[0]) == 5 and got[4].startswith("[train] step=2 ")
    assert got[-1] == throughput[1]


def test_resume_appends(tmp_path: Path) -> None:
    clock = FakeClock(at(1, 2, 3, 4))
    for step in (1, 2):
        sink = TrainLogSink(tmp_path, clock=clock)
        sink.write("train", step, {"updated": 1, "loss": 1.0})
        sink.close()
    assert lines(tmp_path / "train.log") == [
        "[train] step=1 updated=1 loss=1.000 ts=01:02:03.004",
        "[train] step=2 updated=1 loss=1.000 ts=01:02:03.004",
    ]


def test_threads_write_whole_lines(tmp_path: Path) -> None:
    sink = TrainLogSink(tmp_path, throughput_interval=3600)

    def work(worker: int) -> None:
        for i in range(200):
            sink.write("rollout", worker * 1000 + i, {"generated": 32, "tokens": 18420})

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sink.close()
    got = lines(tmp_path / "train.log")
    assert len(got) == 1600
    assert all(ROLLOUT.match(line) for line in got)
    steps = {int(line.split()[1].removeprefix("step=")) for line in got}
    assert len(steps) == 1600


def test_closed_sink_refuses_writes_and_line_buffering(tmp_path: Path) -> None:
    sink = TrainLogSink(tmp_path)
    sink.write("train", 1, {"updated": 1, "loss": 0.5})
    # line-buffered: visible to a reader before close
    assert len(lines(tmp_path / "train.log")) == 1
    sink.close()
    sink.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        sink.write("train", 2, {"updated": 1, "loss": 0.5})


def test_factory_through_the_registry(tmp_path: Path) -> None:
    sink = make_metric_sink("train_log", {"log_dir": str(tmp_path / "logs")})
    sink.write("train", 1, {"updated": 2, "loss": 0.25})
    sink.close()
    assert lines(tmp_path / "logs" / "train.log")[0].startswith(
        "[train] step=1 updated=2 loss=0.250"
    )
    with pytest.raises(ValueError, match=r"needs options\.log_dir"):
        train_log_sink({})
    with pytest.raises(ValueError, match="no option"):
        train_log_sink({"log_dir": str(tmp_path), "interval": 5})
    with pytest.raises(ValueError, match="throughput_interval"):
        train_log_sink({"log_dir": str(tmp_path), "throughput_interval": 0})
