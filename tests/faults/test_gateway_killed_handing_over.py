"""A gateway SIGKILLed while handing an episode's trajectory to the trainer's queue (real engine
and gateway processes, the real ZeroMQ queue, the run's episode ledger): just before the put,
the trainer never gets the episode and the books count it lost; just after the queue's
acknowledgement, before the gateway noted it, the trainer has it and the books count it
accepted, not lost, and never both (``episodes_running`` stays >= 0). Either way the books
balance against what the trainer received, and read the same on a resume. Real processes: the
serial tier."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from areal.core.episode_journal import EpisodeBooks, read_journal
from areal.core.queue import make_source
from areal.host.faults import CRASH_ENV
from areal.host.process import ServerProcess
from areal.plugins.models.tiny import init_tiny
from areal.run.accounting import EpisodeLedger
from support import eventually
from support.processes import (
    POLICY,
    client,
    end_session,
    open_session,
    start_engine,
    start_gateway,
)


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("engine")
    init_tiny(tmp / "model", size="nano", seed=0)
    engine, url = start_engine(tmp / "model", tmp)
    try:
        yield url
    finally:
        engine.stop(timeout=5)


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize(
    ("crash_at", "delivered"), [("gateway.handing_over", False), ("gateway.handed_over", True)]
)
def test_a_gateway_killed_handing_over_leaves_books_that_balance(
    engine_url: str, tmp_path: Path, crash_at: str, delivered: bool
) -> None:
    journal = tmp_path / "episodes.journal"
    ledger = EpisodeLedger(journal, fresh=True)
    source = make_source("zmq", {"address": "tcp://127.0.0.1:*", "on_receipt": ledger.received})
    gateways: list[ServerProcess] = []
    try:
        dying, url = start_gateway(
            engine_url, tmp_path, sink=("zmq", source.address), env={CRASH_ENV: crash_at}
        )
        gateways.append(dying)
        session, key = open_session(url)
        client(url, key).chat.completions.create(
            model=POLICY, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        with pytest.raises(httpx.TransportError):  # the gateway dies answering the end
            end_session(url, session)
        eventually(lambda: dying.returncode is not None, 60, "the gateway's exit")
        assert dying.returncode == -signal.SIGKILL, "the gateway did not die at the crash point"

        arrived = source.get(timeout=10 if delivered else 1)
        assert (arrived is not None) == delivered
        assert arrived is None or arrived.session_id == session
        assert source.received == int(delivered)

        restarted, _ = start_gateway(engine_url, tmp_path)  # its boot closes the dead one's books
        gateways.append(restarted)
        books = ledger.read()
        assert (books.started, books.accepted, books.rejected, books.lost) == (
            1,
            int(delivered),
            0,
            int(not delivered),
        ), books
        # The identity the run's ``accounting`` event states: started = discarded + received +
        # running, with nothing running (the next gateway has opened nothing).
        assert books.started - books.discarded - source.received == books.running == 0

        resumed = EpisodeBooks()  # a ``--resume`` folds the journal from its start
        read_journal(journal, resumed)
        assert (resumed.accepted, resumed.lost) == (books.accepted, books.lost)
    finally:
        for gateway in gateways:
            gateway.stop(timeout=5)
        source.close()
