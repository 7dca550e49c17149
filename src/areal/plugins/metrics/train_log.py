"""``{log_dir}/train.log``: one human-readable line per event, in the seed article's shapes.

    [rollout] step=120 generated=32 tokens=18420 ts=14:23:01.221
    [train] step=118 updated=32 loss=0.421 ts=14:23:01.335
    [throughput] samples_per_second=3.2 tokens_per_second=1842.5 ts=14:23:10.002

Any other event is written as ``[event] step=N key=value ... ts=HH:MM:SS.mmm`` in the order the
values were given (for ``rollout`` and ``train`` the seed's keys come first, whatever the order).

Throughput uses tumbling windows of ``throughput_interval`` seconds (default 10): the first window
opens when the sink is created, and the first ``rollout`` or ``train`` event at least that long
after the window opened closes it with one ``[throughput]`` line and opens the next.
``samples_per_second`` is the samples trained (``updated`` of ``train`` events) and
``tokens_per_second`` the tokens generated (``tokens`` of ``rollout`` events) in the window,
divided by the window's actual length (from its opening to the closing event).

The file is opened in append mode (a resumed run continues the same log) and line-buffered, and
each line is written whole under a lock, so threads never interleave.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from areal.core.metrics import MetricValue
from areal.host.line_file import LineFile

FILE_NAME = "train.log"
DEFAULT_THROUGHPUT_INTERVAL = 10.0

# The seed's keys, in the seed's order, for the events it shows.
_LEADING_KEYS = {"rollout": ("generated", "tokens"), "train": ("updated", "loss")}


def format_ts(t: float) -> str:
    """``14:23:01.221``: local wall-clock time, rounded to the millisecond."""
    ms = round(t * 1000)
    return datetime.fromtimestamp(ms // 1000).strftime("%H:%M:%S") + f".{ms % 1000:03d}"


def format_value(key: str, value: MetricValue) -> str:
    """Compact, unambiguous text for one value: a loss with 3 decimals, other floats with at most
    3 (trailing zeros dropped), tiny floats in 3 significant digits, strings quoted if needed."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)  # nan, inf, -inf
        if key == "loss" or key.endswith("_loss"):
            return f"{value:.3f}"
        if value != 0 and abs(value) < 0.01:
            return f"{value:.3g}"
        text = f"{value:.3f}".rstrip("0")
        return text + "0" if text.endswith(".") else text
    text = str(value)
    if not text or any(c.isspace() or c in '="' for c in text):
        return json.dumps(text)
    return text


def format_line(event: str, step: int | None, values: Mapping[str, MetricValue], ts: float) -> str:
    """One ``train.log`` line, without the newline."""
    leading = [k for k in _LEADING_KEYS.get(event, ()) if k in values]
    keys = leading + [k for k in values if k not in leading]
    parts = [f"[{event}]"]
    if step is not None:
        parts.append(f"step={step}")
    parts += [f"{k}={format_value(k, values[k])}" for k in keys]
    parts.append(f"ts={format_ts(ts)}")
    return " ".join(parts)


class TrainLogSink:
    """The ``train_log`` :class:`~areal.core.metrics.MetricSink`."""

    def __init__(
        self,
        log_dir: str | Path,
        *,
        throughput_interval: float = DEFAULT_THROUGHPUT_INTERVAL,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not throughput_interval > 0:
            raise ValueError(f"throughput_interval must be > 0 seconds, got {throughput_interval}")
        self.path = Path(log_dir) / FILE_NAME
        self.throughput_interval = throughput_interval
        self._clock = clock
        self._out = LineFile(self.path, "train log")
        self._window_start = clock()
        self._samples = 0.0
        self._tokens = 0.0

    def write(self, event: str, step: int, values: Mapping[str, MetricValue]) -> None:
        with self._out.lock:  # the throughput window and the file move together
            if self._out.closed:
                raise RuntimeError(f"the train log {self.path} is closed")
            now = self._clock()
            lines = [format_line(event, step, values, now)]
            if event in _LEADING_KEYS:
                self._count(event, values)
                if now - self._window_start >= self.throughput_interval:
                    lines.append(self._close_window(now))
            self._out.write_locked("".join(line + "\n" for line in lines))

    def _count(self, event: str, values: Mapping[str, MetricValue]) -> None:
        key, total = ("updated", "_samples") if event == "train" else ("tokens", "_tokens")
        value = values.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            setattr(self, total, getattr(self, total) + value)

    def _close_window(self, now: float) -> str:
        span = now - self._window_start
        rates = {
            "samples_per_second": self._samples / span,
            "tokens_per_second": self._tokens / span,
        }
        self._window_start, self._samples, self._tokens = now, 0.0, 0.0
        return format_line("throughput", None, rates, now)

    def close(self) -> None:
        self._out.close()


def train_log_sink(options: dict[str, Any]) -> TrainLogSink:
    """The registered factory: ``log_dir`` (required), ``throughput_interval`` (seconds)."""
    log_dir = options.get("log_dir")
    if not log_dir or not isinstance(log_dir, (str, os.PathLike)):
        raise ValueError("the train_log metric sink needs options.log_dir (where train.log goes)")
    unknown = sorted(set(options) - {"log_dir", "throughput_interval"})
    if unknown:
        raise ValueError(f"the train_log metric sink has no option(s) {', '.join(unknown)}")
    interval = float(options.get("throughput_interval", DEFAULT_THROUGHPUT_INTERVAL))
    return TrainLogSink(Path(log_dir), throughput_interval=interval)
