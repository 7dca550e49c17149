"""The run's episode journal: one line per session event, so a run's books survive a SIGKILL.

A gateway keeps its session counters in memory; killed, it takes them along, and the trainer can
no longer say how many episodes it had started or had open. So a gateway attached to a run
appends one line per event to a file: ``b`` when it boots, ``s ID`` when it admits session
``ID``, ``a ID`` when the trainer's queue acknowledged its trajectory, ``r ID`` when it ends
without one (discarded, empty, expired, refused as stale, or still open at a clean shutdown).
Each line is one ``write(2)`` on an ``O_APPEND`` descriptor: once it returns the line is in the
kernel's page cache, which outlives the process, so a SIGKILL loses no event already counted.

A gateway killed between the trainer's receipt of a trajectory and its own ``a`` line leaves an
episode the journal alone would count lost while the trainer counts it received (and a gateway
that stops before the queue's acknowledgement comes notes ``r`` for one the queue took). The
trainer settles those from its receipts (:meth:`EpisodeBooks.received`) and appends ``t ID``
for each, so the books read the same again on ``--resume``. ``t`` lines are rare (one per such
episode) and short, so the two writers' appends never interleave within a line.

:func:`read_journal` folds the file into :class:`EpisodeBooks`: a ``b`` closes the books of the
gateway before it, whose sessions still open were lost with it (discarded, from the trainer's
point of view) unless the trainer received them. Journals of older versions (one byte per event,
no ids) still fold, by counts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

BOOT, START, ACCEPT, REJECT, TAKEN = b"b", b"s", b"a", b"r", b"t"
# How many episodes the books remember by id while they may still settle: received ones whose
# ``a`` line has not come, and the latest ended without a trajectory (a gateway that writes no
# journal, or a long run's discards, must not grow the trainer's memory without bound).
MAX_REMEMBERED = 100_000


class EpisodeJournal:
    """A writing end (``path=None``: a gateway outside a run writes nothing). A gateway's
    journal notes its boot on opening; the trainer's (``boot=False``) writes only ``t``."""

    def __init__(self, path: str | Path | None, *, boot: bool = True) -> None:
        self._fd: int | None = None
        if path is not None:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            if boot:
                self.note(BOOT)

    def note(self, event: bytes, session_id: str = "") -> None:
        if self._fd is not None:
            os.write(
                self._fd, b"%s %s\n" % (event, session_id.encode()) if session_id else event + b"\n"
            )

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass
class EpisodeBooks:
    """Every episode the run's gateways started, by where it went; ``started`` is their sum."""

    started: int = 0
    accepted: int = 0  # received by the trainer's queue
    rejected: int = 0  # ended without a trajectory
    lost: int = 0  # open on a gateway that died, never received
    boots: int = 0
    # On the current gateway (a dict for its order: settled episodes are noted as they opened).
    open_ids: dict[str, None] = field(default_factory=dict, repr=False)
    open_unnamed: int = 0  # the same, from a journal without ids
    lost_ids: set[str] = field(default_factory=set, repr=False)
    # The latest episodes a gateway ended without a trajectory: one whose put failed after the
    # queue had taken it (a gateway stopping before its ack came) is received all the same.
    rejected_ids: dict[str, None] = field(default_factory=dict, repr=False)
    # Received by the trainer, the journal's word on them still to come (insertion-ordered).
    unjournaled: dict[str, None] = field(default_factory=dict, repr=False)
    # Settled by the trainer's receipts, not yet in the journal as ``t`` lines.
    settled: list[str] = field(default_factory=list, repr=False)

    @property
    def running(self) -> int:
        """Open on the gateway that writes the journal now."""
        return len(self.open_ids) + self.open_unnamed

    @property
    def discarded(self) -> int:
        return self.rejected + self.lost

    def fold(self, event: bytes, session_id: str = "") -> None:
        """One journal event."""
        if event == BOOT:
            self.boots += 1
            self.lost += self.open_unnamed
            self.open_unnamed = 0
            for sid in self.open_ids:
                if not self._settle(sid):
                    self.lost += 1
                    self.lost_ids.add(sid)
            self.open_ids.clear()
        elif event == START:
            self.started += 1
            if session_id:
                self.open_ids[session_id] = None
            else:
                self.open_unnamed += 1
        elif event == ACCEPT and self._close(session_id):
            self.unjournaled.pop(session_id, None)
            self.accepted += 1
        elif event == REJECT and self._close(session_id) and not self._settle(session_id):
            self.rejected += 1
            if session_id:
                _remember(self.rejected_ids, session_id)
        elif event == TAKEN:
            self._recover(session_id)

    def received(self, session_id: str) -> None:
        """The trainer received the trajectory of ``session_id``: an episode the journal counts
        lost or rejected is moved to ``accepted`` (and to :attr:`settled`); one it does not know
        the end of yet is remembered until it does."""
        if self._recover(session_id):
            self.settled.append(session_id)
        elif session_id:
            _remember(self.unjournaled, session_id)

    def _close(self, session_id: str) -> bool:
        """An open episode ends; ``False`` for one the journal does not have open."""
        if session_id in self.open_ids:
            del self.open_ids[session_id]
            return True
        if not session_id and self.open_unnamed:
            self.open_unnamed -= 1
            return True
        return False

    def _settle(self, session_id: str) -> bool:
        """An episode ending without a trajectory as far as its gateway knows: accepted, and
        noted (``t``), if the trainer received it."""
        if session_id not in self.unjournaled:
            return False
        del self.unjournaled[session_id]
        self.accepted += 1
        self.settled.append(session_id)
        return True

    def _recover(self, session_id: str) -> bool:
        """A lost or rejected episode the trainer received after all: accepted."""
        if session_id in self.lost_ids:
            self.lost_ids.remove(session_id)
            self.lost -= 1
        elif session_id in self.rejected_ids:
            del self.rejected_ids[session_id]
            self.rejected -= 1
        else:
            return False
        self.accepted += 1
        return True


def _remember(ids: dict[str, None], session_id: str) -> None:
    """Add to a bounded, insertion-ordered set: the oldest goes past ``MAX_REMEMBERED``."""
    ids[session_id] = None
    if len(ids) > MAX_REMEMBERED:
        del ids[next(iter(ids))]


def read_journal(path: str | Path, books: EpisodeBooks | None = None, offset: int = 0) -> int:
    """Fold the journal's whole lines from byte ``offset`` into ``books``; returns the offset
    read up to, so a reader that calls again reads only what was appended since."""
    books = books if books is not None else EpisodeBooks()
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return offset
    end = data.rfind(b"\n") + 1  # a line still being written is read next time
    for line in data[:end].splitlines():
        event, _, session_id = line.partition(b" ")
        if session_id:
            books.fold(event, session_id.decode())
        else:  # ``b``, or an older journal's run of one-byte events
            for byte in event:
                books.fold(bytes((byte,)))
    return offset + end
