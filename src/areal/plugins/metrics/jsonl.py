"""``{log_dir}/metrics.jsonl``: one JSON object per event, for plots and scripts.

Each line is ``{"event": ..., "step": ..., "time": <unix seconds, ms precision>, **values}``.
Non-finite floats are written as the strings ``"nan"``, ``"inf"``, ``"-inf"`` (a NaN loss is worth
seeing, and strict JSON has no NaN; ``float()`` reads them back). A value named ``event``, ``step``
or ``time`` is refused rather than silently overwriting the record's own field. Append mode (a
resumed run continues the file), one whole line per write under a lock, flushed at once.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from areal.core.metrics import MetricValue
from areal.host.line_file import LineFile

FILE_NAME = "metrics.jsonl"
RESERVED = ("event", "step", "time")


def _jsonable(value: MetricValue) -> MetricValue:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class JsonlMetricSink:
    """The ``jsonl`` :class:`~areal.core.metrics.MetricSink`."""

    def __init__(self, log_dir: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(log_dir) / FILE_NAME
        self._clock = clock
        self._out = LineFile(self.path, "metrics file")

    def write(self, event: str, step: int, values: Mapping[str, MetricValue]) -> None:
        clash = [k for k in RESERVED if k in values]
        if clash:
            raise ValueError(
                f"metric value name(s) {', '.join(clash)} are reserved in metrics.jsonl"
            )
        record: dict[str, Any] = {"event": event, "step": step, "time": round(self._clock(), 3)}
        record.update((k, _jsonable(v)) for k, v in values.items())
        self._out.write(json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n")

    def close(self) -> None:
        self._out.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a ``metrics.jsonl`` (a file or its log dir), in order."""
    path = Path(path)
    if path.is_dir():
        path = path / FILE_NAME
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def jsonl_metric_sink(options: dict[str, Any]) -> JsonlMetricSink:
    """The registered factory: ``options["log_dir"]`` (required)."""
    log_dir = options.get("log_dir")
    if not log_dir or not isinstance(log_dir, (str, os.PathLike)):
        raise ValueError("the jsonl metric sink needs options.log_dir (where metrics.jsonl goes)")
    unknown = sorted(set(options) - {"log_dir"})
    if unknown:
        raise ValueError(f"the jsonl metric sink has no option(s) {', '.join(unknown)}")
    return JsonlMetricSink(Path(log_dir))
