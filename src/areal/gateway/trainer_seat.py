"""The trainer seat of a gateway: which run trains its policy now, and until when its lease runs.

Its own module so that the gateway's state can name it without importing the routes that
manage it (``trainer_api``); the lease reads an injectable clock, so its expiry is tested
without waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from areal.core.episode_journal import EpisodeJournal
from areal.gateway.router_config import ModelRoute

DEFAULT_LEASE_S = 120.0


@dataclass
class TrainerSeat:
    """The run that trains this gateway's policy now."""

    trainer_id: str
    lease_s: float = DEFAULT_LEASE_S
    route_before: ModelRoute | None = None  # the policy's sampling before the run set its own
    journal_before: EpisodeJournal | None = None  # the gateway's own journal, while the run's runs
    since: float = field(default_factory=time.time)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)  # tests pass a fake
    heard: float = field(init=False)

    def __post_init__(self) -> None:
        self.heard = self.clock()

    def renew(self) -> None:
        self.heard = self.clock()

    def lapsed(self) -> bool:
        return self.clock() - self.heard > self.lease_s

    def describe(self) -> dict[str, Any]:
        return {
            "trainer_id": self.trainer_id,
            "since": self.since,
            "last_heard_s": round(self.clock() - self.heard, 1),
            "lease_s": self.lease_s,
            "lapsed": self.lapsed(),
        }
