"""The flags that attach a gateway to a training run, shared by both front ends.

``python -m areal.gateway.server`` (argparse, :func:`add_training_arguments`) and ``areal serve gateway``
(typer) take the same flags with the same names, defaults and help texts, all from here; the run
supervisor (``areal train``) starts the gateway with :meth:`TrainingFlags.to_argv`, their inverse.
Light on purpose (no aiohttp, no zmq): ``areal --help`` imports it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Any

from areal.core.staleness import StalenessBudget

NO_SINK = "none"  # sessions end without a trajectory going anywhere


def sink_names() -> list[str]:
    """The trajectory sinks the queue registry has (``zmq``, ``jsonl``, plugins'), and ``none``."""
    from areal.core.plugins import registry

    names = [n for n in registry("queues").names() if "/" not in n]  # "x/source": consumer ends
    return [*names, NO_SINK]


DEFAULT_IDLE_TIMEOUT_S = 600.0
DEFAULT_ONLINE_IDLE_S = 300.0
DEFAULT_ONLINE_REWARD_WAIT_S = 600.0
# How an online conversation that names no group is grouped (areal.gateway.online_groups, where
# each is described; bench/online_grouping.py measured them, docs/gateway.md has the figures).
ONLINE_GROUPINGS = ("pool", "prompt", "none")
DEFAULT_ONLINE_GROUPING = "pool"
DEFAULT_ONLINE_GROUP_WINDOW_S = 300.0
DEFAULT_ONLINE_GROUP_SIZE = 16

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
    "start_consumed": "Staleness budget: episodes the trainer has already received in this run "
    "(a resume, a restarted gateway), so they count as accepted (default 0).",
    "start_dropped": "Staleness budget: how many of those the trainer dropped as stale (default 0).",
    "episode_journal": "Append one line per session event (boot, start, accepted, rejected) to "
    "this file, so the run's episode books survive a killed gateway (default: none).",
    "discount": "Per-turn discount of later rewards, in [0, 1] (default 1): turn k's return is "
    "r_k + F·G_{k+1}.",
    "session_idle_timeout": "End an RL session as discarded after this many seconds without a "
    "call, reward or end, so a crashed worker frees its budget slot (default 600; 0: never).",
    "online": "Record the calls agents make with the plain gateway key: one session per "
    "conversation (the x-areal-conversation header, else the client's session hint), admitted "
    "by the staleness budget (429 when full); rewards via /rl/conversations (default: off, such "
    "calls are served and not recorded).",
    "online_idle_timeout": "--online: end a conversation after this many seconds without a call "
    "(default 300).",
    "online_reward_wait": "--online: how long an ended conversation waits for its reward before "
    "it is discarded, untrained (default 600).",
    "online_grouping": "--online: the group of a conversation that names none (x-areal-group, "
    "metadata.areal_group): pool (conversations handed to the trainer one after another share "
    "a group), prompt (only those whose first user message is the same) or none (alone: GRPO and "
    "RLOO give it advantage 0); default pool.",
    "online_group_window": "--online: a default group takes conversations for this many seconds "
    "after its first (default 300).",
    "online_group_size": "--online: conversations in a default group at most (default 16).",
}


@dataclass(frozen=True)
class Flag:
    """How one field is spelled on the command line."""

    option: str
    type: type
    metavar: str | None = None


FLAGS: dict[str, Flag] = {
    "sink": Flag("--sink", str),
    "sink_address": Flag("--sink-address", str, "ADDR"),
    "staleness_threshold": Flag("--staleness-threshold", int, "N"),
    "trigger_batch_size": Flag("--trigger-batch-size", int, "N"),
    "max_concurrent": Flag("--max-concurrent", int, "N"),
    "start_version": Flag("--start-version", int, "N"),
    "start_consumed": Flag("--start-consumed", int, "N"),
    "start_dropped": Flag("--start-dropped", int, "N"),
    "episode_journal": Flag("--episode-journal", str, "PATH"),
    "discount": Flag("--discount", float, "F"),
    "session_idle_timeout": Flag("--session-idle-timeout", float, "S"),
    "online": Flag("--online", bool),  # a switch: given or not
    "online_idle_timeout": Flag("--online-idle-timeout", float, "S"),
    "online_reward_wait": Flag("--online-reward-wait", float, "S"),
    "online_grouping": Flag("--online-grouping", str),
    "online_group_window": Flag("--online-group-window", float, "S"),
    "online_group_size": Flag("--online-group-size", int, "N"),
}
OPTION: dict[str, str] = {name: flag.option for name, flag in FLAGS.items()}

# ``POST /rl/trainer``'s keys for the flags a run sets when it attaches to a running gateway.
SEAT_KEYS: dict[str, str] = {
    "sink": "sink",
    "sink_address": "sink_address",
    "staleness_threshold": "staleness_threshold",
    "trigger_batch_size": "trigger_batch_size",
    "max_concurrent": "max_concurrent",
    "version": "start_version",
    "consumed": "start_consumed",
    "dropped": "start_dropped",
    "discount": "discount",
    "episode_journal": "episode_journal",
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
    start_consumed: int = 0
    start_dropped: int = 0
    episode_journal: str | None = None
    discount: float = 1.0
    session_idle_timeout: float = DEFAULT_IDLE_TIMEOUT_S
    online: bool = False
    online_idle_timeout: float = DEFAULT_ONLINE_IDLE_S
    online_reward_wait: float = DEFAULT_ONLINE_REWARD_WAIT_S
    online_grouping: str = DEFAULT_ONLINE_GROUPING
    online_group_window: float = DEFAULT_ONLINE_GROUP_WINDOW_S
    online_group_size: int = DEFAULT_ONLINE_GROUP_SIZE

    @classmethod
    def from_values(cls, values: Any) -> TrainingFlags:
        """The flags out of an object holding them by name (argparse's namespace)."""
        return cls(**{f.name: getattr(values, f.name) for f in fields(cls)})

    def to_argv(self) -> list[str]:
        """The command line that parses back into these flags (a flag left ``None``, or a switch
        left off, is left out: the parsers' default)."""
        argv: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool):
                argv += [OPTION[f.name]] if value else []
            elif value is not None:
                argv += [OPTION[f.name], str(value)]
        return argv

    def check(self) -> TrainingFlags:
        sink, address = OPTION["sink"], OPTION["sink_address"]
        known = sink_names()
        if self.sink not in known:
            raise ValueError(f"{sink} must be one of {', '.join(known)}, got {self.sink!r}")
        if self.sink == "zmq" and not self.sink_address:
            raise ValueError(
                f"{sink} zmq needs {address}, the trainer's queue address "
                "(e.g. tcp://127.0.0.1:5555)"
            )
        if self.sink == "none" and self.sink_address:
            raise ValueError(f"{address} has no meaning with {sink} none")
        for name, low in (
            ("staleness_threshold", 0),
            ("trigger_batch_size", 1),
            ("max_concurrent", 1),
            ("start_version", 0),
            ("start_consumed", 0),
            ("start_dropped", 0),
        ):
            value = getattr(self, name)
            if value is not None and value < low:
                raise ValueError(f"{OPTION[name]} must be >= {low}, got {value}")
        if not 0.0 <= self.discount <= 1.0:
            raise ValueError(f"{OPTION['discount']} must be within [0, 1], got {self.discount}")
        if self.session_idle_timeout < 0:
            raise ValueError(
                f"{OPTION['session_idle_timeout']} must be >= 0 (0: off), "
                f"got {self.session_idle_timeout}"
            )
        if self.online_idle_timeout <= 0:
            raise ValueError(
                f"{OPTION['online_idle_timeout']} must be > 0, got {self.online_idle_timeout}"
            )
        if self.online_reward_wait < 0:
            raise ValueError(
                f"{OPTION['online_reward_wait']} must be >= 0, got {self.online_reward_wait}"
            )
        if self.online_grouping not in ONLINE_GROUPINGS:
            raise ValueError(
                f"{OPTION['online_grouping']} must be one of {', '.join(ONLINE_GROUPINGS)}, "
                f"got {self.online_grouping!r}"
            )
        if self.online_group_window <= 0:
            raise ValueError(
                f"{OPTION['online_group_window']} must be > 0, got {self.online_group_window}"
            )
        if self.online_group_size < 1:
            raise ValueError(
                f"{OPTION['online_group_size']} must be >= 1, got {self.online_group_size}"
            )
        return self

    def budget(self) -> StalenessBudget:
        """The run's staleness budget (no threshold and no cap: unbounded, as before)."""
        return StalenessBudget(
            trigger_batch_size=self.trigger_batch_size or 1,
            staleness_threshold=self.staleness_threshold,
            max_concurrent=self.max_concurrent,
            version=self.start_version,
            consumed=self.start_consumed,
            dropped=self.start_dropped,
        )

    def to_seat(self) -> dict[str, Any]:
        """These flags as the body of ``POST /rl/trainer`` (a run taking a running gateway's
        trainer seat); :data:`SEAT_KEYS` maps them back."""
        values = ((key, getattr(self, name)) for key, name in SEAT_KEYS.items())
        return {key: value for key, value in values if value is not None}

    def sink_name(self) -> str | None:
        return None if self.sink == "none" else self.sink

    def sink_options(self) -> dict[str, Any]:
        if not self.sink_address:
            return {}
        return {"address" if self.sink == "zmq" else "path": self.sink_address}

    def idle_timeout(self) -> float | None:
        return self.session_idle_timeout or None


DEFAULTS = TrainingFlags()


def add_training_arguments(parser: argparse.ArgumentParser) -> None:
    """The training flags for argparse (``python -m areal.gateway.server``), from :data:`FLAGS`."""
    group = parser.add_argument_group("training run")
    sinks = sink_names()
    for name, flag in FLAGS.items():
        if flag.type is bool:
            group.add_argument(flag.option, dest=name, action="store_true", help=HELP[name])
            continue
        group.add_argument(
            flag.option,
            dest=name,
            type=flag.type,
            default=getattr(DEFAULTS, name),
            choices={"sink": sinks, "online_grouping": ONLINE_GROUPINGS}.get(name),
            metavar=flag.metavar,
            help=HELP[name],
        )
