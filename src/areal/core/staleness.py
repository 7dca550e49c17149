"""How far rollouts may run ahead of the trainer: the version clock and AReaL's admission rule.

A sample's staleness is ``trainer_version - min(version of its generated tokens)``. To keep every
sample within ``staleness_threshold`` versions of the weights it trains, a producer starts a new
episode only while

    (staleness_threshold + version + 1) * trigger_batch_size > accepted + running

(``accepted`` counts every episode handed to the trainer since the run began, less those the
trainer dropped as stale; ``running`` the ones in flight), and while ``running`` is under the
concurrency cap. Everything is counted in episodes (whole trajectories): each trainer step
consumes ``trigger_batch_size`` of them and advances ``version`` by one, which opens room for one
more batch. The gateway answers ``429`` with ``Retry-After`` when
:meth:`StalenessBudget.try_start` says no.

``accepted`` is the run's, not the process's: a gateway that restarts (or serves a resumed run)
at version ``v`` with nothing accepted would admit ``(threshold + v + 1)`` batches at once. So
the budget keeps running totals that the trainer re-seeds (:meth:`StalenessBudget.reseed`) with
what it has consumed and dropped; the totals only grow, so re-announcing the same numbers
changes nothing. Pure Python (no torch), thread-safe: the trainer may move the clock from
another thread.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# The staleness of a token whose version cannot be read: above every threshold.
UNREADABLE = 2**31 - 1


def staleness(trainer_version: int, token_versions: Iterable[int]) -> int:
    """How many versions behind ``trainer_version`` the oldest generated token is (0 if none).

    ``token_versions`` are the versions of generated tokens only (a prompt token has none). One
    that is not a version of this run is unreadable: negative (SGLang's and vLLM's start-up
    ``"default"``, a missing label) or newer than the trainer (an engine still labelled by
    another run; the run's engines get a version only after the trainer has it). The weights
    that sampled it are unknown, so it is :data:`UNREADABLE`, staler than any bound: its sample
    is dropped as stale, never trained as fresh.
    """
    versions = list(token_versions)
    if not versions:
        return 0
    oldest, newest = min(versions), max(versions)
    if oldest < 0 or newest > trainer_version:
        return UNREADABLE
    return trainer_version - oldest


@dataclass
class BudgetSnapshot:
    """The counters at one instant (for status routes and logs)."""

    version: int
    accepted: int  # what the rule counts: accepted_total - released
    running: int
    rejected: int
    capacity: int | None  # None: unbounded
    accepted_total: int = 0
    released: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "accepted": self.accepted,
            "running": self.running,
            "rejected": self.rejected,
            "capacity": self.capacity,
            "accepted_total": self.accepted_total,
            "released": self.released,
        }


class StalenessBudget:
    """The version clock plus the admission counters of one run.

    ``staleness_threshold=None`` turns the version rule off and ``max_concurrent=None`` the cap, so
    the default budget admits everything (a gateway not attached to a trainer).
    """

    def __init__(
        self,
        *,
        trigger_batch_size: int = 1,
        staleness_threshold: int | None = None,
        max_concurrent: int | None = None,
        version: int = 0,
        retry_after_s: float = 1.0,
        consumed: int = 0,
        dropped: int = 0,
    ) -> None:
        if trigger_batch_size < 1:
            raise ValueError(f"trigger_batch_size must be >= 1, got {trigger_batch_size}")
        if staleness_threshold is not None and staleness_threshold < 0:
            raise ValueError(f"staleness_threshold must be >= 0, got {staleness_threshold}")
        if max_concurrent is not None and max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
        if retry_after_s <= 0:
            raise ValueError(f"retry_after_s must be > 0, got {retry_after_s}")
        self.trigger_batch_size = trigger_batch_size
        self.staleness_threshold = staleness_threshold
        self.max_concurrent = max_concurrent
        self.retry_after_s = retry_after_s
        self._version = version
        self._accepted_total = consumed  # handed to the trainer, this run, all time
        self._running = 0
        self._rejected = 0
        self._released = dropped  # accepted episodes the trainer dropped as stale, given back
        self._lock = threading.Lock()

    @property
    def version(self) -> int:
        return self._version

    @property
    def accepted(self) -> int:
        """The episodes the rule counts as handed over: all accepted, less the released."""
        with self._lock:
            return self._net()

    def _net(self) -> int:
        return max(0, self._accepted_total - self._released)

    @property
    def running(self) -> int:
        return self._running

    def _capacity(self) -> int | None:
        limits = []
        if self.staleness_threshold is not None:
            allowed = (self.staleness_threshold + self._version + 1) * self.trigger_batch_size
            limits.append(allowed - (self._net() + self._running))
        if self.max_concurrent is not None:
            limits.append(self.max_concurrent - self._running)
        return max(0, min(limits)) if limits else None

    def capacity(self) -> int | None:
        """How many more episodes may start now; ``None`` when nothing limits them."""
        with self._lock:
            return self._capacity()

    def try_start(self) -> bool:
        """Admit one episode (it is now running) if there is room; ``False`` means retry later."""
        with self._lock:
            room = self._capacity()
            if room is not None and room <= 0:
                return False
            self._running += 1
            return True

    def finish(self, *, accepted: bool) -> None:
        """A running episode ended: handed to the trainer (``accepted``) or dropped."""
        with self._lock:
            if self._running <= 0:
                raise RuntimeError("finish() without a running episode")
            self._running -= 1
            if accepted:
                self._accepted_total += 1
            else:
                self._rejected += 1

    def release_dropped(self, total_dropped: int) -> int:
        """The trainer has now dropped ``total_dropped`` accepted episodes as stale (a running
        total of the run): they leave ``accepted``, so a drop does not shrink the look-ahead for
        good (the episodes that outlive the bound are the long ones; keeping their slots would
        also bias the run against long outputs). A total already seen frees nothing. Returns how
        many slots this call freed."""
        with self._lock:
            before = self._net()
            self._released = max(self._released, total_dropped)
            return before - self._net()

    def reseed(self, *, consumed: int, dropped: int, pending: int = 0) -> None:
        """The trainer has received ``consumed`` episodes and dropped ``dropped`` of them, in all
        of the run (across resumes and gateway restarts): ``accepted`` is at least that.

        ``pending`` is how many of this gateway's episodes are being handed over right now: the
        trainer may already count them while :meth:`finish` has not yet, so they are left out
        here (:meth:`finish` counts them) rather than counted twice. Idempotent: totals only
        grow, so the same announce twice, or an older one, changes nothing.
        """
        with self._lock:
            self._accepted_total = max(self._accepted_total, consumed - pending)
            self._released = max(self._released, dropped)

    def carry_running(self, other: StalenessBudget) -> None:
        """Take over ``other``'s running episodes: a budget that replaces another (a trainer
        attaching to a gateway) must still count the episodes that will finish under it."""
        with self._lock:
            self._running = other.running

    def set_version(self, version: int) -> None:
        """The trainer's weights are now ``version`` (the clock never moves back)."""
        with self._lock:
            self._version = max(self._version, version)

    def snapshot(self) -> BudgetSnapshot:
        with self._lock:
            return BudgetSnapshot(
                self._version,
                self._net(),
                self._running,
                self._rejected,
                self._capacity(),
                self._accepted_total,
                self._released,
            )
