"""The JSONL trajectory sink: one finished episode per line, so users can see what would be trained.

Append-only; each line is written whole and flushed (a reader tailing the file never sees half a
trajectory), and the file is fsynced on close. Writes run in a worker thread under a lock, so
concurrent ``put`` calls from many sessions neither interleave nor block the event loop.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from areal.core.types import Trajectory
from areal.host.line_file import LineFile


class JsonlSink:
    """``TrajectorySink`` writing ``Trajectory.to_json()`` lines to ``path``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._out = LineFile(self.path, "JSONL sink")
        self.written = 0

    def _write(self, line: str) -> None:
        with self._out.lock:
            self._out.write_locked(line)
            self.written += 1

    async def put(self, trajectory: Trajectory) -> None:
        line = json.dumps(trajectory.to_json(), separators=(",", ":")) + "\n"
        await asyncio.to_thread(self._write, line)

    async def close(self) -> None:
        await asyncio.to_thread(self._out.close)


def jsonl_sink(options: dict[str, Any]) -> JsonlSink:
    """The registered factory: ``options["path"]`` names the file (created if missing)."""
    path = options.get("path")
    if not path or not isinstance(path, (str, os.PathLike)):
        raise ValueError(
            "the jsonl trajectory sink needs options.path (the file to append trajectories to)"
        )
    unknown = sorted(set(options) - {"path"})
    if unknown:
        raise ValueError(f"the jsonl trajectory sink has no option(s) {', '.join(unknown)}")
    return JsonlSink(Path(path))
