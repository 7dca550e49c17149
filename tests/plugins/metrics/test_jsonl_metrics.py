"""metrics.jsonl: round trip, append on resume, whole lines from threads; the tensorboard factory."""

from __future__ import annotations

import importlib.util
import json
import math
import threading
from pathlib import Path

import pytest

from areal.core.metrics import make_metric_sink
from areal.core.plugins import registry
from areal.plugins.metrics.jsonl import JsonlMetricSink, jsonl_metric_sink, read_metrics
from areal.plugins.metrics.register import TENSORBOARD_MISSING, tensorboard_sink
from support.clock import FakeClock


def test_round_trip(tmp_path: Path) -> None:
    clock = FakeClock(1_700_000_000.12345)
    sink = JsonlMetricSink(tmp_path, clock=clock)
    sink.write("rollout", 120, {"generated": 32, "tokens": 18420})
    clock.advance(0.114)
    sink.write("train", 118, {"updated": 32, "loss": 0.421, "note": "ok", "kl": float("nan")})
    sink.close()
    records = read_metrics(tmp_path)
    assert records[0] == {
        "event": "rollout",
        "step": 120,
        "time": 1_700_000_000.123,
        "generated": 32,
        "tokens": 18420,
    }
    assert records[1]["time"] == 1_700_000_000.237
    assert {k: records[1][k] for k in ("event", "step", "updated", "loss", "note")} == {
        "event": "train",
        "step": 118,
        "updated": 32,
        "loss": 0.421,
        "note": "ok",
    }
    assert records[1]["kl"] == "nan" and math.isnan(float(records[1]["kl"]))
    first = (tmp_path / "metrics.jsonl").read_text().splitlines()[0]
    assert list(json.loads(first)) == ["event", "step", "time", "generated", "tokens"]


def test_resume_appends_and_reserved_names_are_refused(tmp_path: Path) -> None:
    for step in (1, 2):
        sink = JsonlMetricSink(tmp_path)
        sink.write("train", step, {"loss": 1.0})
        sink.close()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]
    sink = JsonlMetricSink(tmp_path)
    with pytest.raises(ValueError, match="reserved"):
        sink.write("train", 3, {"step": 4})
    sink.close()
    with pytest.raises(RuntimeError, match="closed"):
        sink.write("train", 3, {"loss": 1.0})


def test_threads_write_whole_lines(tmp_path: Path) -> None:
    sink = JsonlMetricSink(tmp_path)

    def work(worker: int) -> None:
        for i in range(200):
            sink.write("rollout", worker * 1000 + i, {"generated": 32, "text": "x" * 300})

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sink.close()
    records = read_metrics(tmp_path)  # json.loads fails on any torn line
    assert len({r["step"] for r in records}) == len(records) == 1600


def test_registered_sinks_and_factory_errors(tmp_path: Path) -> None:
    names = registry("metric_sinks").names()
    assert {"train_log", "jsonl", "tensorboard"} <= set(names)
    sink = make_metric_sink("jsonl", {"log_dir": tmp_path})
    sink.write("eval", 5, {"reward": 0.75})
    sink.close()
    assert read_metrics(tmp_path)[0]["reward"] == 0.75
    with pytest.raises(ValueError, match=r"needs options\.log_dir"):
        jsonl_metric_sink({})
    with pytest.raises(ValueError, match="no option"):
        jsonl_metric_sink({"log_dir": str(tmp_path), "path": "x"})


def test_tensorboard_missing_names_the_pip_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # tensorboard is a dependency; an environment without it is simulated at the lookup.
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name)
    )
    with pytest.raises(RuntimeError, match="pip install tensorboard") as info:
        tensorboard_sink({"log_dir": str(tmp_path)})
    assert str(info.value) == TENSORBOARD_MISSING


@pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed"
)
def test_tensorboard_writes_event_files(tmp_path: Path) -> None:
    sink = tensorboard_sink({"log_dir": str(tmp_path)})
    sink.write("train", 1, {"loss": 0.5, "note": "skipped"})
    sink.close()
    assert any((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
