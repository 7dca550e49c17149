"""The run's episode books: every episode a gateway started, and where it went.

The ``accounting`` event states, in episodes (whole trajectories), for all of the run (across
``--resume`` and gateway restarts):

    sent = trained + dropped + discarded + queued + running

Where each number comes from, so that it survives the process that would otherwise hold it:

- ``sent`` and ``discarded``: the gateways' episode journal (:mod:`areal.core.episode_journal`),
  a file the killed gateway cannot take along. ``discarded`` counts the sessions that ended
  without a trajectory and those still open on a gateway that died (``lost``), less those whose
  trajectory the trainer received all the same (the gateway died before noting its hand-over:
  the ledger settles them from the queue's receipts and notes them in the journal).
- ``trained``, ``dropped`` and ``queued``: the trainer's own counters, checkpointed with the loop
  (``queued``: received, not yet trained or dropped: in the queue's buffer or the loop's).
- ``running``: the rest: started, neither discarded nor received yet (open on the live gateway,
  or being handed over). The live gateway's own count comes along as ``episodes_open``; a
  negative ``running`` would mean an episode received twice or never started.
"""

from __future__ import annotations

import logging
from collections import deque
from pathlib import Path
from typing import Any, Protocol

from areal.core.episode_journal import TAKEN, EpisodeBooks, EpisodeJournal, read_journal
from areal.core.metrics import MetricValue
from areal.core.types import Trajectory

log = logging.getLogger("areal.train")

JOURNAL_NAME = "episodes.journal"


class _Loop(Protocol):
    def counters(self) -> dict[str, int]: ...

    def pending(self) -> list[Any]: ...


class _Queue(Protocol):
    @property
    def buffered(self) -> int: ...

    @property
    def buffered_tombstones(self) -> int: ...


def consumed(loop: _Loop, queue: _Queue) -> tuple[int, int]:
    """(episodes received, episodes dropped as stale), all of the run: what the gateway's budget
    is re-seeded with (the queue's buffer is acknowledged, so it counts as received; the
    tombstones in it announce discarded episodes, which the journal counts)."""
    counters = loop.counters()
    in_queue = queue.buffered - queue.buffered_tombstones
    return counters["trajectories"] + in_queue, counters["dropped_trajectories"]


class EpisodeLedger:
    """Reads the journal as it grows and writes the identity's terms."""

    def __init__(self, journal: Path, *, fresh: bool) -> None:
        self.journal = journal
        if fresh:  # a new run in an old output directory starts new books
            journal.unlink(missing_ok=True)
        self.books = EpisodeBooks()
        self._offset = 0
        self._receipts: deque[str] = deque()  # appended on the queue's thread, read on ours

    def received(self, trajectory: Trajectory) -> None:
        """The queue's ``on_receipt``: a trajectory the trainer now holds."""
        if not trajectory.is_tombstone:
            self._receipts.append(trajectory.session_id)

    def read(self) -> EpisodeBooks:
        """The books, with what the journal and the queue's receipts said since the last read;
        the episodes the receipts settled are noted in the journal (``t``), for a resume."""
        while self._receipts:
            self.books.received(self._receipts.popleft())
        self._offset = read_journal(self.journal, self.books, self._offset)
        if self.books.settled:
            journal = EpisodeJournal(self.journal, boot=False)
            for session_id in self.books.settled:
                journal.note(TAKEN, session_id)
            journal.close()
            self.books.settled.clear()
        return self.books

    def values(self, loop: _Loop, queue: _Queue, gateway_running: int) -> dict[str, MetricValue]:
        books = self.read()
        counters = loop.counters()
        buffered = len(loop.pending())
        received, dropped = consumed(loop, queue)
        queued = queue.buffered - queue.buffered_tombstones + buffered
        trained = counters["trajectories"] - dropped - buffered
        running = books.started - books.discarded - received
        if running < 0:
            log.warning(
                "episode books: %d received but only %d started and not discarded",
                received,
                books.started - books.discarded,
            )
        return {
            "episodes_sent": books.started,
            "episodes_trained": trained,
            "episodes_dropped": dropped,
            "episodes_discarded": books.discarded,
            "episodes_queued": queued,
            "episodes_running": running,
            "episodes_lost": books.lost,
            "episodes_open": gateway_running,
        }
