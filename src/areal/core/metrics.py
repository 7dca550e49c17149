"""The seam between the run and what records it: metric sinks, and a hub that fans out to them.

A metrics plugin (``areal_register_metric_sinks``) registers a factory
``(options: dict) -> MetricSink``. Built in: ``train_log`` (``{log_dir}/train.log``, the seed
article's lines), ``jsonl`` (``{log_dir}/metrics.jsonl``) and ``tensorboard`` (when the
``tensorboard`` package is installed).

Losing a log line must never cost a training run: :class:`MetricsHub` catches a sink's error, logs
it once with the sink's name, disables that sink and goes on with the others.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any, Protocol

MetricValue = float | int | str

logger = logging.getLogger("areal.metrics")


class MetricSink(Protocol):
    """Records one event (``rollout``, ``train``, ``eval`` ...) at one step; thread-safe."""

    def write(self, event: str, step: int, values: Mapping[str, MetricValue]) -> None: ...

    def close(self) -> None: ...


def make_metric_sink(name: str, options: dict[str, Any]) -> MetricSink:
    """Build the sink a plugin registered under ``name`` (an unknown name lists the known ones)."""
    from areal.core.plugins import registry

    factory = registry("metric_sinks").get(name, key="metric sink")
    sink: MetricSink = factory(options)
    return sink


class MetricsHub:
    """A :class:`MetricSink` that writes every event to several named sinks.

    A sink that raises is logged (with its name and the event) and disabled: it gets no further
    events, though :meth:`close` still closes it so its file is released.
    """

    def __init__(self, sinks: Mapping[str, MetricSink]) -> None:
        self._sinks: dict[str, MetricSink] = dict(sinks)
        self._disabled: dict[str, str] = {}
        self._lock = threading.Lock()
        self._closed = False

    @property
    def active(self) -> list[str]:
        """Names of the sinks still being written to."""
        with self._lock:
            return [n for n in self._sinks if n not in self._disabled]

    @property
    def disabled(self) -> dict[str, str]:
        """Disabled sinks, name -> the error that disabled them."""
        with self._lock:
            return dict(self._disabled)

    def write(self, event: str, step: int, values: Mapping[str, MetricValue]) -> None:
        """Fan ``event`` out; never raises because of a sink."""
        for name, sink in self._live():
            try:
                sink.write(event, step, values)
            except Exception as exc:
                self._disable(name, f"{type(exc).__name__}: {exc}", event=event, step=step)

    def close(self) -> None:
        """Close every sink once, disabled ones included (to release their files)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sinks = list(self._sinks.items())
        for name, sink in sinks:
            try:
                sink.close()
            except Exception as exc:
                logger.warning(
                    "metric sink %r failed to close: %s: %s", name, type(exc).__name__, exc
                )

    def _live(self) -> list[tuple[str, MetricSink]]:
        with self._lock:
            if self._closed:
                raise RuntimeError("the metrics hub is closed")
            return [(n, s) for n, s in self._sinks.items() if n not in self._disabled]

    def _disable(self, name: str, error: str, *, event: str, step: int) -> None:
        with self._lock:
            if name in self._disabled:
                return
            self._disabled[name] = error
        logger.error(
            "metric sink %r failed on event %r at step %d and is disabled for the rest of the run: %s",
            name,
            event,
            step,
            error,
        )
