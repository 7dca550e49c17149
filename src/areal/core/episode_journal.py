"""The gateway's episode journal: one byte per session event, so a run's books survive a SIGKILL.

A gateway keeps its session counters in memory; killed, it takes them along, and the trainer can
no longer say how many episodes it had started or had open. So a gateway attached to a run
appends one byte per event to a file: ``b`` when it boots, ``s`` when it admits a session, ``a``
when it hands a trajectory to the trainer's queue, ``r`` when a session ends without one
(discarded, empty, expired, refused as stale, or still open at a clean shutdown). Each byte is
one ``write(2)`` on an ``O_APPEND`` descriptor: once it returns the byte is in the kernel's page
cache, which outlives the process, so a SIGKILL loses no event already counted.

:func:`read_journal` folds the file into :class:`EpisodeBooks`: a ``b`` closes the books of the
gateway before it, whose sessions still open were lost with it (discarded, from the trainer's
point of view). One writer at a time: the run starts the next gateway only after the last exits.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

BOOT, START, ACCEPT, REJECT = b"b", b"s", b"a", b"r"


class EpisodeJournal:
    """The gateway's writing end (``path=None``: a gateway outside a run writes nothing)."""

    def __init__(self, path: str | Path | None) -> None:
        self._fd: int | None = None
        if path is not None:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self.note(BOOT)

    def note(self, event: bytes) -> None:
        if self._fd is not None:
            os.write(self._fd, event)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass
class EpisodeBooks:
    """Every episode the run's gateways started, by where it went; ``started`` is their sum."""

    started: int = 0
    accepted: int = 0  # handed to the trainer's queue
    rejected: int = 0  # ended without a trajectory
    lost: int = 0  # open on a gateway that died
    boots: int = 0

    @property
    def running(self) -> int:
        """Open on the gateway that writes the journal now."""
        return self.started - self.accepted - self.rejected - self.lost

    @property
    def discarded(self) -> int:
        return self.rejected + self.lost


def read_journal(path: str | Path, books: EpisodeBooks | None = None, offset: int = 0) -> int:
    """Fold the journal from byte ``offset`` into ``books``; returns the offset read up to, so a
    reader that calls again reads only what was appended since."""
    books = books if books is not None else EpisodeBooks()
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return offset
    for byte in data:
        event = bytes((byte,))
        if event == BOOT:
            books.lost += books.running
            books.boots += 1
        elif event == START:
            books.started += 1
        elif event == ACCEPT:
            books.accepted += 1
        elif event == REJECT:
            books.rejected += 1
    return offset + len(data)
