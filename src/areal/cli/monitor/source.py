"""Where the monitor's events come from: a run's ZeroMQ publisher, or a finished run's record.

``areal monitor TARGET``: a ``tcp://`` URL is subscribed to; a directory is a run's log dir (or an
output dir holding ``logs/``): while its ``events.json`` names a live process, the monitor
subscribes to the address in it (the publisher replays the recent past to a new subscriber);
otherwise the run is over and its ``metrics.jsonl`` is replayed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal.cli.errors import CLIError

EVENTS_FILE = "events.json"
METRICS_FILE = "metrics.jsonl"


@dataclass(frozen=True)
class Target:
    """A resolved ``areal monitor`` argument: ``address`` to subscribe to (``pid``: the run's
    process, when known), or the ``replay`` file of a finished run."""

    address: str | None = None
    replay: Path | None = None
    pid: int | None = None


def resolve(target: str) -> Target:
    """Turn ``RUN_DIR`` or ``URL`` into what to read; one-line errors for the user."""
    if "://" in target:
        return Target(address=target)
    path = Path(target)
    if not path.exists():
        raise CLIError(
            f"{target}: no such run directory or URL (give a log dir or tcp://HOST:PORT)"
        )
    for log_dir in (path, path / "logs"):
        info = read_events_file(log_dir) or {}
        pid, address = int(info.get("pid", 0)), info.get("address")
        if pid_alive(pid) and isinstance(address, str):
            return Target(address=address, pid=pid)
        if (log_dir / METRICS_FILE).is_file():
            return Target(replay=log_dir / METRICS_FILE)
    raise CLIError(
        f"{target}: neither {EVENTS_FILE} of a running run nor {METRICS_FILE} of a finished one "
        "(give the run's logging.log_dir; the 'events' and 'jsonl' metric sinks write them)"
    )


def read_events_file(log_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((log_dir / EVENTS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    return True


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl``; a torn last line (a run killed mid-write) is skipped."""
    records = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
    return records


class Subscriber:
    """A ZeroMQ SUB socket on a run's publisher; :meth:`poll` returns new records, in order."""

    def __init__(self, address: str) -> None:
        import zmq

        self._zmq = zmq
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.RCVHWM, 100_000)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        try:
            self._socket.connect(address)
        except zmq.ZMQError as exc:
            self.close()
            raise CLIError(f"cannot connect to {address}: {exc}") from None
        self._seen: set[tuple[str, int]] = set()

    def poll(self, timeout: float) -> list[dict[str, Any]]:
        """Every record waiting (after up to ``timeout`` seconds for the first), replays of
        records already seen dropped, sorted by the publisher's sequence numbers."""
        zmq = self._zmq
        batch: list[tuple[str, int, dict[str, Any]]] = []
        if not self._socket.poll(int(timeout * 1000), zmq.POLLIN):
            return []
        while True:
            try:
                message = self._socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                envelope = json.loads(message)
                key = (str(envelope["run"]), int(envelope["seq"]))
                record = envelope["record"]
            except (ValueError, KeyError, TypeError):
                continue
            if key not in self._seen and isinstance(record, dict):
                self._seen.add(key)
                batch.append((key[0], key[1], record))
        batch.sort(key=lambda item: (item[0], item[1]))
        return [record for _, _, record in batch]

    def close(self) -> None:
        self._socket.close(0)
        self._context.term()
