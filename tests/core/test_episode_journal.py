"""The episode journal's books, folded by hand: what each event does, and the episodes a gateway
killed mid-hand-over leaves for the trainer's receipts to settle (the same books again on a
resume, which folds the file from its start)."""

from __future__ import annotations

from pathlib import Path

import pytest

from areal.core import episode_journal
from areal.core.episode_journal import (
    ACCEPT,
    REJECT,
    START,
    EpisodeBooks,
    EpisodeJournal,
    read_journal,
)
from areal.core.types import Trajectory
from areal.run.accounting import EpisodeLedger


def counts(books: EpisodeBooks) -> tuple[int, int, int, int, int]:
    return books.started, books.accepted, books.rejected, books.lost, books.running


def folded(path: Path) -> EpisodeBooks:
    """The books a resume reads: the whole file, no receipts."""
    books = EpisodeBooks()
    read_journal(path, books)
    return books


def test_each_event_is_one_line_and_only_whole_lines_are_read(tmp_path: Path) -> None:
    path = tmp_path / "episodes.journal"
    gateway = EpisodeJournal(path)
    gateway.note(START, "s_1")
    gateway.note(ACCEPT, "s_1")
    assert path.read_bytes() == b"b\ns s_1\na s_1\n"
    with path.open("ab") as f:
        f.write(b"s s_2")  # a line still being written
    books = EpisodeBooks()
    offset = read_journal(path, books)
    assert offset == len(b"b\ns s_1\na s_1\n") and counts(books) == (1, 1, 0, 0, 0)
    with path.open("ab") as f:
        f.write(b"\n")
    assert read_journal(path, books, offset) == path.stat().st_size
    assert counts(books) == (2, 1, 0, 0, 1)
    gateway.close()


def test_a_boot_counts_the_open_episodes_lost_unless_the_trainer_has_them(tmp_path: Path) -> None:
    path = tmp_path / "episodes.journal"
    ledger = EpisodeLedger(path, fresh=True)
    first = EpisodeJournal(path)
    for sid in ("s_a", "s_b", "s_c", "s_d", "s_e"):
        first.note(START, sid)
    ledger.received(trajectory("s_a"))
    first.note(ACCEPT, "s_a")  # the usual order: received, then acknowledged, then noted
    first.note(REJECT, "s_b")
    ledger.received(trajectory("s_c"))  # received, and the gateway died before noting it
    assert counts(ledger.read()) == (5, 1, 1, 0, 3)
    EpisodeJournal(path)  # the next gateway boots: s_c, s_d, s_e were open on the dead one
    assert counts(ledger.read()) == (5, 2, 1, 2, 0)  # s_c received: not lost
    ledger.received(trajectory("s_e"))  # still in flight at the boot, received after it
    ledger.received(trajectory("s_e", tombstone=True))  # a tombstone is no episode received
    books = ledger.read()
    assert counts(books) == (5, 3, 1, 1, 0)  # s_a, s_c, s_e accepted; s_d lost
    assert books.lost_ids == {"s_d"}
    # The trainer's word on s_c and s_e is in the journal, so a resume reads the same books.
    assert path.read_bytes().endswith(b"b\nt s_c\nt s_e\n")
    assert counts(folded(path)) == (5, 3, 1, 1, 0)
    assert ledger.read().settled == []  # nothing noted twice
    assert path.read_bytes().count(b"t ") == 2


def test_an_episode_its_gateway_gave_up_on_but_the_trainer_received_is_accepted(
    tmp_path: Path,
) -> None:
    """A gateway stopping before the queue's acknowledgement came notes ``r`` for a trajectory
    the queue may have taken: the trainer's receipt, before or after that line, wins."""
    path = tmp_path / "episodes.journal"
    ledger = EpisodeLedger(path, fresh=True)
    gateway = EpisodeJournal(path)
    for sid in ("s_x", "s_y", "s_z"):
        gateway.note(START, sid)
    ledger.received(trajectory("s_x"))
    for sid in ("s_x", "s_y", "s_z"):
        gateway.note(REJECT, sid)
    assert counts(ledger.read()) == (3, 1, 2, 0, 0)  # s_x received before its r line
    ledger.received(trajectory("s_y"))  # and s_y after it
    assert counts(ledger.read()) == (3, 2, 1, 0, 0)
    assert path.read_bytes().endswith(b"r s_z\nt s_x\nt s_y\n")
    assert counts(folded(path)) == (3, 2, 1, 0, 0)
    gateway.close()


def test_a_journal_of_one_byte_events_still_folds(tmp_path: Path) -> None:
    path = tmp_path / "episodes.journal"
    path.write_bytes(b"bsssar" + b"b")  # an older version's journal: two sessions ended, one lost
    gateway = EpisodeJournal(path)  # this version's gateway appends its boot on resume
    gateway.note(START, "s_new")
    assert counts(folded(path)) == (4, 1, 1, 1, 1)
    gateway.close()


def test_the_books_remember_a_bounded_number_of_receipts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(episode_journal, "MAX_REMEMBERED", 3)
    books = EpisodeBooks()
    for i in range(5):
        books.received(f"s_{i}")
    assert list(books.unjournaled) == ["s_2", "s_3", "s_4"]


def trajectory(session_id: str, *, tombstone: bool = False) -> Trajectory:
    metadata = {"discarded": True} if tombstone else {}
    return Trajectory(
        session_id=session_id, samples=[], reward=None, completions=0, metadata=metadata
    )
