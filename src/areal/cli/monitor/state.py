"""What the live monitor knows about a run: a state object fed one event record at a time.

A record is what ``metrics.jsonl`` holds and what the ``events`` sink publishes: ``event``,
``step``, ``time`` (Unix seconds) and the event's values. The state keeps the newest record of
each event and the last ``keep`` records of each for series and rates; everything it shows is
computed from records, never from the wall clock, so feeding a recorded stream always renders the
same picture (the monitor's tests rely on that).

Plugin panels get this object as their ``view``: :meth:`MonitorState.latest` and
:meth:`MonitorState.series` are the documented part (``docs/plugins.md``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

DEFAULT_KEEP = 240


def as_float(value: Any) -> float | None:
    """A record value as a number (``"nan"``/``"inf"`` as written by metrics.jsonl), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)
    return None


class MonitorState:
    """The newest record and the recent records of every event kind (module docstring)."""

    def __init__(self, keep: int = DEFAULT_KEEP) -> None:
        self.keep = keep
        self._latest: dict[str, dict[str, Any]] = {}
        self._recent: dict[str, deque[dict[str, Any]]] = {}
        self.staleness: list[int] = []  # samples by staleness on arrival, summed over the run
        self.first_time: float | None = None
        self.last_time: float | None = None
        self.records = 0
        self.version = 0  # bumped on every change: a live view redraws only when it moved

    # --- feeding ---------------------------------------------------------------------------------

    def feed(self, record: Mapping[str, Any]) -> None:
        """Take one event record; records without an ``event`` name or a ``time`` are ignored."""
        event, at = record.get("event"), as_float(record.get("time"))
        if not isinstance(event, str) or at is None or not math.isfinite(at):
            return
        values = dict(record)
        newest = self._latest.get(event)
        if newest is None or at >= newest["time"]:
            self._latest[event] = values
        self._recent.setdefault(event, deque(maxlen=self.keep)).append(values)
        if event == "rollout":
            self._count_staleness(values.get("staleness_hist"))
        self.first_time = at if self.first_time is None else min(self.first_time, at)
        self.last_time = at if self.last_time is None else max(self.last_time, at)
        self.records += 1
        self.version += 1

    def feed_all(self, records: Iterable[Mapping[str, Any]]) -> None:
        for record in records:
            self.feed(record)

    def _count_staleness(self, hist: Any) -> None:
        if not isinstance(hist, str) or not hist:
            return
        try:
            counts = [int(c) for c in hist.split(",")]
        except ValueError:
            return
        if len(counts) > len(self.staleness):
            self.staleness.extend([0] * (len(counts) - len(self.staleness)))
        for lag, count in enumerate(counts):
            self.staleness[lag] += count

    # --- the view (also what plugin panels get) --------------------------------------------------

    def latest(self, event: str) -> dict[str, Any]:
        """The newest record of ``event`` (a copy; ``{}`` before the first one)."""
        return dict(self._latest.get(event, {}))

    def series(self, event: str, key: str) -> list[float]:
        """``key``'s numeric values over the recent ``event`` records, oldest first."""
        found = (as_float(r.get(key)) for r in self._recent.get(event, ()))
        return [v for v in found if v is not None]

    def has(self, event: str) -> bool:
        return event in self._latest

    # --- derived numbers -------------------------------------------------------------------------

    def rate(self, event: str, key: str, window: int = 10) -> float | None:
        """``key`` per second over the last ``window`` ``event`` records (values that count what
        happened since the previous record, like ``generated``); None with under two records."""
        recent = list(self._recent.get(event, ()))[-window:]
        if len(recent) < 2:
            return None
        span = float(recent[-1]["time"]) - float(recent[0]["time"])
        total = sum(as_float(r.get(key)) or 0.0 for r in recent[1:])
        return total / span if span > 0 else None

    def rate_of_total(self, event: str, key: str, window: int = 10) -> float | None:
        """The growth per second of a running total (``tokens_trained``) over the last
        ``window`` ``event`` records; None with under two."""
        recent = [
            (float(r["time"]), v)
            for r in list(self._recent.get(event, ()))[-window:]
            if (v := as_float(r.get(key))) is not None
        ]
        if len(recent) < 2 or recent[-1][0] <= recent[0][0]:
            return None
        return (recent[-1][1] - recent[0][1]) / (recent[-1][0] - recent[0][0])

    def elapsed(self) -> float:
        """Seconds from the first to the newest record."""
        if self.first_time is None or self.last_time is None:
            return 0.0
        return self.last_time - self.first_time

    def eta(self) -> float | None:
        """Seconds to ``max_steps`` at the recent train-step rate; None until it is known."""
        max_steps = as_float(self.latest("run").get("max_steps"))
        steps = self.series("train", "step")
        times = self.series("train", "time")[-len(steps) :]
        if max_steps is None or len(steps) < 2:
            return None
        steps, times = steps[-10:], times[-10:]
        if times[-1] <= times[0] or steps[-1] <= steps[0]:
            return None
        per_step = (times[-1] - times[0]) / (steps[-1] - steps[0])
        return max(0.0, max_steps - steps[-1]) * per_step

    def workers(self) -> list[tuple[str, int, int]]:
        """``(worker, episodes in flight, episodes received)`` from the newest accounting."""
        acc = self.latest("accounting")
        names = sorted(
            {k.split("_")[0] for k in acc if k.startswith("rollout") and "_" in k},
            key=lambda n: (len(n), n),
        )
        return [
            (
                n,
                int(as_float(acc.get(f"{n}_running")) or 0),
                int(as_float(acc.get(f"{n}_episodes")) or 0),
            )
            for n in names
        ]

    def summary(self) -> dict[str, Any]:
        """What the panels show, as data for scripts (``areal monitor --json``)."""
        return {
            "records": self.records,
            "elapsed_s": round(self.elapsed(), 3),
            "eta_s": self.eta(),
            "latest": {event: dict(values) for event, values in self._latest.items()},
            "staleness_on_arrival": list(self.staleness),
            "samples_per_s": {
                "rollout": self.rate("rollout", "generated"),
                "train": self.rate("train", "updated"),
            },
            "workers": [
                {"worker": name, "in_flight": running, "episodes": episodes}
                for name, running, episodes in self.workers()
            ],
        }
