"""MetricsHub: fans out to every sink, and a failing sink is logged and disabled, never fatal."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import pytest

from areal.core.metrics import MetricsHub, MetricSink, MetricValue, make_metric_sink
from areal.core.registry import RegistryError
from areal.plugins.metrics.jsonl import JsonlMetricSink, read_metrics


class ListSink:
    """A real, in-memory sink: what it was given, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, dict[str, MetricValue]]] = []
        self.closed = 0

    def write(self, event: str, step: int, values: Mapping[str, MetricValue]) -> None:
        self.events.append((event, step, dict(values)))

    def close(self) -> None:
        self.closed += 1


class DiskFullSink(ListSink):
    """Fails from its second write on, as a sink on a full disk would."""

    def write(self, event: str, step: int, values: Mapping[str, MetricValue]) -> None:
        if self.events:
            raise OSError(28, "No space left on device")
        super().write(event, step, values)

    def close(self) -> None:
        super().close()
        raise OSError(28, "No space left on device")


def test_hub_fans_out_to_every_sink(tmp_path: Path) -> None:
    memory = ListSink()
    hub = MetricsHub({"memory": memory, "jsonl": JsonlMetricSink(tmp_path)})
    sink: MetricSink = hub  # the hub is a sink itself
    sink.write("train", 1, {"loss": 0.5})
    hub.close()
    assert memory.events == [("train", 1, {"loss": 0.5})]
    assert read_metrics(tmp_path)[0]["loss"] == 0.5
    assert memory.closed == 1


def test_a_failing_sink_is_logged_and_disabled(caplog: pytest.LogCaptureFixture) -> None:
    good, bad = ListSink(), DiskFullSink()
    hub = MetricsHub({"bad": bad, "good": good})
    with caplog.at_level(logging.ERROR, logger="areal.metrics"):
        for step in range(1, 5):
            hub.write("rollout", step, {"generated": 8})
    assert [step for _, step, _ in good.events] == [1, 2, 3, 4]
    assert [step for _, step, _ in bad.events] == [1]
    assert hub.active == ["good"]
    assert hub.disabled == {"bad": "OSError: [Errno 28] No space left on device"}
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1  # logged once, not once per event
    assert "'bad'" in errors[0].getMessage() and "step 2" in errors[0].getMessage()
    with caplog.at_level(logging.WARNING, logger="areal.metrics"):
        hub.close()  # a sink failing to close does not stop the others from closing
    assert bad.closed == 1 and good.closed == 1
    assert "failed to close" in caplog.text
    hub.close()  # idempotent
    assert good.closed == 1
    with pytest.raises(RuntimeError, match="closed"):
        hub.write("train", 5, {})


def test_unknown_sink_name_lists_the_known_ones() -> None:
    with pytest.raises(RegistryError, match="jsonl"):
        make_metric_sink("nosuch", {})
