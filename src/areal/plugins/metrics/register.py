"""Built-in metric sinks: ``train_log``, ``jsonl`` and, when its package is installed,
``tensorboard``.

TensorBoard is optional: the project does not depend on it. Its factory imports it on use and, when
it is missing, fails with the pip package to install, so a run config naming it fails at start-up.
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from areal.core.hookspecs import Register, hookimpl
from areal.core.metrics import MetricSink, MetricValue
from areal.plugins.metrics.jsonl import jsonl_metric_sink
from areal.plugins.metrics.train_log import train_log_sink

TENSORBOARD_MISSING = (
    "the tensorboard metric sink needs the 'tensorboard' package, which is not installed: "
    "pip install tensorboard (or drop 'tensorboard' from the run's metric sinks)"
)


class TensorBoardSink:
    """Numeric values as scalars ``{event}/{key}`` at ``step``; strings are skipped."""

    def __init__(self, log_dir: Path) -> None:
        # torch's writer (torch is a dependency already); it needs the tensorboard package.
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir))

    def write(self, event: str, step: int, values: Mapping[str, MetricValue]) -> None:
        for key, value in values.items():
            if isinstance(value, (str, bool)) or not math.isfinite(value):
                continue
            self._writer.add_scalar(f"{event}/{key}", value, global_step=step)

    def close(self) -> None:
        self._writer.close()


def tensorboard_sink(options: dict[str, Any]) -> TensorBoardSink:
    """The registered factory: event files under ``{log_dir}/tensorboard``."""
    if importlib.util.find_spec("tensorboard") is None:
        raise RuntimeError(TENSORBOARD_MISSING)
    log_dir = options.get("log_dir")
    if not log_dir or not isinstance(log_dir, (str, os.PathLike)):
        raise ValueError("the tensorboard metric sink needs options.log_dir")
    unknown = sorted(set(options) - {"log_dir"})
    if unknown:
        raise ValueError(f"the tensorboard metric sink has no option(s) {', '.join(unknown)}")
    return TensorBoardSink(Path(log_dir) / "tensorboard")


def events_sink(options: dict[str, Any]) -> MetricSink:
    """The ZeroMQ publisher; imported on use, so start-up does not pay for zmq."""
    from areal.plugins.metrics.events_pub import events_sink as make

    return make(options)


@hookimpl
def areal_register_metric_sinks(register: Register) -> None:
    """``train_log`` and ``jsonl`` (``options.log_dir``), the optional ``tensorboard``, and
    ``events`` (ZeroMQ PUB for ``areal monitor``)."""
    register("train_log", train_log_sink)
    register("jsonl", jsonl_metric_sink)
    register("tensorboard", tensorboard_sink)
    register("events", events_sink)
