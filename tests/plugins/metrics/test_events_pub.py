"""The ``events`` metric sink over real ZeroMQ sockets: events.json, records in order, a replay of
the recent past for late subscribers, writes that never wait, and events.json gone on close."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import zmq

from areal.core.metrics import make_metric_sink
from areal.plugins.metrics.events_pub import EventPublisher, events_sink, read_events_file
from support import eventually


def subscribe(address: str) -> zmq.Socket[bytes]:
    socket = zmq.Context.instance().socket(zmq.SUB)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.connect(address)
    return socket


def receive(socket: zmq.Socket[bytes], count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
    """The next ``count`` messages; ``timeout`` is a ceiling for each, not a pace."""
    got: list[dict[str, Any]] = []
    for _ in range(count):
        assert socket.poll(round(timeout * 1000)), f"only {len(got)} of {count} messages came"
        got.append(json.loads(socket.recv()))
    return got


def test_events_json_names_the_address_and_goes_away_on_close(tmp_path: Path) -> None:
    sink = make_metric_sink("events", {"log_dir": str(tmp_path)})
    assert isinstance(sink, EventPublisher)
    info = read_events_file(tmp_path)
    assert info["address"] == sink.address and info["address"].startswith("tcp://127.0.0.1:")
    assert info["pid"] == os.getpid() and info["run"] == sink.run_id
    sink.close()
    assert not (tmp_path / "events.json").exists()


def test_a_subscriber_gets_each_record_once_in_order(tmp_path: Path) -> None:
    pub = EventPublisher(tmp_path, clock=lambda: 1700000000.0)
    sub = subscribe(pub.address)
    try:
        # live, not replayed: the subscription reached the publisher before the writes
        eventually(lambda: pub.subscribed, 30, "the subscription reaching the publisher")
        pub.write("train", 1, {"loss": 0.5, "version": 1})
        pub.write("rollout", 2, {"generated": 4, "reward": float("nan")})
        got = receive(sub, 2)
    finally:
        pub.close()
        sub.close()
    records = [m["record"] for m in got]
    assert records == [
        {"event": "train", "step": 1, "time": 1700000000.0, "loss": 0.5, "version": 1},
        {"event": "rollout", "step": 2, "time": 1700000000.0, "generated": 4, "reward": "nan"},
    ]
    assert got[1]["seq"] == got[0]["seq"] + 1 and {m["run"] for m in got} == {pub.run_id}


def test_a_late_subscriber_gets_the_recent_past_replayed(tmp_path: Path) -> None:
    # replay=3: the last three events, plus the newest "run" event that fell out of them.
    pub = EventPublisher(tmp_path, replay=3)
    pub.write("run", 0, {"max_steps": 10})
    for step in range(1, 6):
        pub.write("train", step, {"loss": step / 10})
    eventually(lambda: pub.sent == 6, 30, "the six events published to nobody")
    sub = subscribe(pub.address)
    try:
        got = receive(sub, 4)
    finally:
        pub.close()
        sub.close()
    records = [(m["record"]["event"], m["record"]["step"]) for m in got]
    assert records == [("run", 0), ("train", 3), ("train", 4), ("train", 5)]
    assert [m["seq"] for m in got] == sorted(m["seq"] for m in got)


def test_writes_never_wait_for_the_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    """A write only appends: with the socket's thread stuck in a send (a subscriber that never
    reads, a socket that would block), the trainer's writes still all return, and what they wrote
    is handed to the socket once it moves again (sent, or dropped where a pipe is full)."""
    pub = EventPublisher(None, poll_interval=0.01)
    sub = subscribe(pub.address)
    release, inside = threading.Event(), threading.Event()
    real_send = pub._send

    def stuck_send(message: bytes) -> None:
        inside.set()
        release.wait()
        real_send(message)

    try:
        eventually(
            lambda: pub.subscribed, timeout=30, what="the subscription to reach the publisher"
        )
        monkeypatch.setattr(pub, "_send", stuck_send)
        pub.write("train", 0, {"loss": 0.1})
        assert inside.wait(30), "the socket's thread never tried to send"
        for step in range(1, 20_001):
            pub.write("train", step, {"loss": 0.1, "reward": 0.5})  # returns with the thread stuck
        assert len(pub._pending) == 20_000  # appended, none sent: the thread is still in its send
        release.set()
        eventually(lambda: not pub._pending, timeout=60, what="every write to be handed on")
        assert pub.sent >= 1
    finally:
        release.set()
        sub.close()
        pub.close()


def test_bad_options_are_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no option"):
        events_sink({"log_dir": str(tmp_path), "colour": "red"})
    with pytest.raises(ValueError, match="reserved"):
        pub = EventPublisher(None)
        try:
            pub.write("train", 1, {"time": 3.0})
        finally:
            pub.close()
    with pytest.raises(ValueError, match="cannot bind"):
        EventPublisher(None, address="tcp://256.0.0.1:1")
