"""The ``events`` metric sink: every event of the run, published on ZeroMQ for the live monitor.

``areal monitor RUN_DIR`` finds the publisher through ``{log_dir}/events.json`` (``address``,
``pid``, ``run``), written when the sink starts and removed when it closes, so a leftover file
with a dead ``pid`` means the run is over and its ``metrics.jsonl`` is the record to replay.

It must never slow training: :meth:`EventPublisher.write` only appends to a deque. A background
thread owns the socket (ZeroMQ sockets are not thread-safe); every ``poll_interval`` seconds it
encodes and sends what is pending. Nothing blocks: with no subscriber, or a subscriber too slow to
keep up (its pipe at ``SNDHWM``), messages are dropped, never queued in the trainer.

The socket is an XPUB, so the thread sees each new subscriber and replays the recent past to it
(the newest event of every kind, then the last ``replay`` events, in order): a monitor attached
mid-run shows history at once, and nobody has to be subscribed before the run starts. Every
message is one JSON object ``{"run": <id of this publisher>, "seq": n, "record": {...}}``, the
record being what ``metrics.jsonl`` holds (``event``, ``step``, ``time``, values); subscribers
drop the ``(run, seq)`` pairs they have already seen (a replay reaches every subscriber).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import zmq

from areal.core.metrics import MetricValue
from areal.plugins.metrics.jsonl import RESERVED, _jsonable

FILE_NAME = "events.json"
DEFAULT_ADDRESS = "tcp://127.0.0.1:*"
DEFAULT_REPLAY = 2048
_OPTIONS = {"log_dir", "address", "replay", "poll_interval"}


class EventPublisher:
    """The ``events`` :class:`~areal.core.metrics.MetricSink` (module docstring)."""

    def __init__(
        self,
        log_dir: str | Path | None,
        *,
        address: str = DEFAULT_ADDRESS,
        replay: int = DEFAULT_REPLAY,
        poll_interval: float = 0.05,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if replay < 0 or not poll_interval > 0:
            raise ValueError("the events sink needs replay >= 0 and poll_interval > 0")
        self.run_id = secrets.token_hex(6)
        self.poll_interval = poll_interval
        self.sent = 0
        self.subscribed = 0  # subscriptions seen: a counted subscriber gets every later event
        self._clock = clock
        self._pending: deque[tuple[str, int, float, dict[str, MetricValue]]] = deque()
        self._recent: deque[tuple[int, bytes]] = deque(maxlen=replay)
        self._newest: dict[str, tuple[int, bytes]] = {}
        self._seq = 0
        self._stop = threading.Event()
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.XPUB)
        self._socket.setsockopt(zmq.XPUB_VERBOSE, 1)  # hear every subscriber, not only the first
        self._socket.setsockopt(zmq.SNDHWM, max(1000, 2 * replay + 64))
        self._socket.setsockopt(zmq.LINGER, 500)  # the last events (``end``) still go out
        try:
            self._socket.bind(address)
        except zmq.ZMQError as exc:
            self._socket.close(0)
            self._context.term()
            raise ValueError(f"the events sink cannot bind {address}: {exc}") from None
        self.address = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.path = Path(log_dir) / FILE_NAME if log_dir is not None else None
        if self.path is not None:
            _write_atomically(
                self.path, {"address": self.address, "pid": os.getpid(), "run": self.run_id}
            )
        self._thread = threading.Thread(target=self._serve, name="areal-events", daemon=True)
        self._thread.start()

    def write(self, event: str, step: int, values: Mapping[str, MetricValue]) -> None:
        clash = [k for k in RESERVED if k in values]
        if clash:
            raise ValueError(f"metric value name(s) {', '.join(clash)} are reserved in events")
        self._pending.append((event, step, self._clock(), dict(values)))

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=5)
        self._socket.close()
        self._context.term()
        if self.path is not None:
            with contextlib.suppress(OSError, ValueError):
                if json.loads(self.path.read_text())["run"] == self.run_id:
                    self.path.unlink()

    # --- the socket's thread -------------------------------------------------------------------

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while True:
            stopping = self._stop.is_set()
            if dict(poller.poll(0 if stopping else round(self.poll_interval * 1000))):
                self._subscriptions()
            self._flush()
            if stopping:
                return

    def _subscriptions(self) -> None:
        joined = False
        while True:
            try:
                message = self._socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            if message[:1] == b"\x01":
                joined = True
                self.subscribed += 1
        if joined:
            self._flush()  # what was written before the subscriber came is part of its replay
            oldest = self._recent[0][0] if self._recent else self._seq + 1
            older = sorted(item for item in self._newest.values() if item[0] < oldest)
            for _, message in [*older, *self._recent]:
                self._send(message)

    def _flush(self) -> None:
        while self._pending:
            event, step, at, values = self._pending.popleft()
            self._seq += 1
            record: dict[str, Any] = {"event": event, "step": step, "time": round(at, 3)}
            record.update((k, _jsonable(v)) for k, v in values.items())
            envelope = {"run": self.run_id, "seq": self._seq, "record": record}
            message = json.dumps(envelope, separators=(",", ":"), allow_nan=False).encode()
            self._recent.append((self._seq, message))
            self._newest[event] = (self._seq, message)
            self._send(message)

    def _send(self, message: bytes) -> None:
        with contextlib.suppress(zmq.Again):  # a full subscriber pipe: drop, never wait
            self._socket.send(message, zmq.NOBLOCK)
            self.sent += 1


def _write_atomically(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data) + "\n")
    os.replace(tmp, path)


def read_events_file(path: str | Path) -> dict[str, Any]:
    """``events.json`` of a log dir (or the file itself): ``address``, ``pid``, ``run``."""
    path = Path(path)
    if path.is_dir():
        path = path / FILE_NAME
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def events_sink(options: dict[str, Any]) -> EventPublisher:
    """The registered factory: ``log_dir`` (where ``events.json`` goes), ``address`` (default
    ``tcp://127.0.0.1:*``, a free port), ``replay`` (events kept for late subscribers)."""
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise ValueError(f"the events metric sink has no option(s) {', '.join(unknown)}")
    log_dir = options.get("log_dir")
    if log_dir is not None and not isinstance(log_dir, (str, os.PathLike)):
        raise ValueError("the events metric sink's options.log_dir must be a path")
    return EventPublisher(
        Path(log_dir) if log_dir is not None else None,
        address=str(options.get("address", DEFAULT_ADDRESS)),
        replay=int(options.get("replay", DEFAULT_REPLAY)),
        poll_interval=float(options.get("poll_interval", 0.05)),
    )
