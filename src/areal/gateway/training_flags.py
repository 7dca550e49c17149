"""The flags that attach a gateway to a training run, shared by both front ends.

``python -m areal.gateway.server`` (argparse) and ``areal serve gateway`` (typer) take the same
flags with the same defaults and help texts, all from here; the run supervisor (``areal train``)
starts the gateway with them. Light on purpose (no aiohttp, no zmq): ``areal --help`` imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from areal.core.staleness import StalenessBudget

SINKS: tuple[str, ...] = ("jsonl", "zmq", "none")
DEFAULT_IDLE_TIMEOUT_S = 600.0

HELP: dict[str, str] = {
    "sink": "Where finished RL episodes go: jsonl (a file, to inspect them), zmq (the trainer's "
    "trajectory queue) or none (dropped); default jsonl.",
    "sink_address": "zmq: the trainer's queue (ROUTER) address, e.g. tcp://127.0.0.1:5555 "
    "(required); jsonl: the file (default: LOG_DIR/trajectories.jsonl).",
    "staleness_threshold": "Staleness budget: how many versions rollouts may run ahead of the "
    "trainer (default: no version limit).",
    "trigger_batch_size": "Staleness budget: episodes the trainer consumes per step (default 1).",
    "max_concurrent": "Most RL sessions open at once (default: no cap).",
    "start_version": "Version the trainer's clock starts at, e.g. when resuming (default 0).",
    "discount": "Per-turn discount of the episode reward over earlier samples, in [0, 1] "
    "(default 1).",
    "session_idle_timeout": "End an RL session as discarded after this many seconds without a "
    "call, reward or end, so a crashed worker frees its budget slot (default 600; 0: never).",
}


@dataclass(frozen=True)
class TrainingFlags:
    """What the training flags say; ``check`` refuses contradictions with a message naming the flag."""

    sink: str = "jsonl"
    sink_address: str | None = None
    staleness_threshold: int | None = None
    trigger_batch_size: int | None = None
    max_concurrent: int | None = None
    start_version: int = 0
    discount: float = 1.0
    session_idle_timeout: float = DEFAULT_IDLE_TIMEOUT_S

    @classmethod
    def from_values(cls, values: Any) -> TrainingFlags:
        """The flags out of an object holding them by name (argparse's namespace)."""
        return cls(**{f.name: getattr(values, f.name) for f in fields(cls)})

    def check(self) -> TrainingFlags:
        if self.sink not in SINKS:
            raise ValueError(f"--sink must be one of {', '.join(SINKS)}, got {self.sink!r}")
        if self.sink == "zmq" and not self.sink_address:
            raise ValueError(
                "--sink zmq needs --sink-address, the trainer's queue address "
                "(e.g. tcp://127.0.0.1:5555)"
            )
        if self.sink == "none" and self.sink_address:
            raise ValueError("--sink-address has no meaning with --sink none")
        for flag, value, low in (
            ("--staleness-threshold", self.staleness_threshold, 0),
            ("--trigger-batch-size", self.trigger_batch_size, 1),
            ("--max-concurrent", self.max_concurrent, 1),
            ("--start-version", self.start_version, 0),
        ):
            if value is not None and value < low:
                raise ValueError(f"{flag} must be >= {low}, got {value}")
        if not 0.0 <= self.discount <= 1.0:
            raise ValueError(f"--discount must be within [0, 1], got {self.discount}")
        if self.session_idle_timeout < 0:
            raise ValueError(
                f"--session-idle-timeout must be >= 0 (0: off), got {self.session_idle_timeout}"
            )
        return self

    def budget(self) -> StalenessBudget:
        """The run's staleness budget (no threshold and no cap: unbounded, as before)."""
        return StalenessBudget(
            trigger_batch_size=self.trigger_batch_size or 1,
            staleness_threshold=self.staleness_threshold,
            max_concurrent=self.max_concurrent,
            version=self.start_version,
        )

    def sink_name(self) -> str | None:
        return None if self.sink == "none" else self.sink

    def sink_options(self) -> dict[str, Any]:
        if not self.sink_address:
            return {}
        return {"address" if self.sink == "zmq" else "path": self.sink_address}

    def idle_timeout(self) -> float | None:
        return self.session_idle_timeout or None
