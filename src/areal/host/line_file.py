"""An append-only text file written one whole line at a time, shared by the JSONL trajectory sink,
``metrics.jsonl`` and ``train.log``.

Lines are written under a lock and flushed at once, so concurrent writers never interleave and a
reader tailing the file never sees half a line; append mode lets a resumed run continue the file;
``close`` fsyncs, so what was written survives a crash of the machine.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import IO


class LineFile:
    def __init__(self, path: str | Path, what: str = "file") -> None:
        self.path = Path(path)
        self.what = what
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = self.path.open("a", encoding="utf-8")
        self.lock = threading.Lock()

    def write(self, text: str) -> None:
        """Append ``text`` (one or more whole lines, each ending in a newline) and flush."""
        with self.lock:
            self.write_locked(text)

    def write_locked(self, text: str) -> None:
        """:meth:`write` for a caller that already holds :attr:`lock`."""
        if self._file is None:
            raise RuntimeError(f"the {self.what} {self.path} is closed")
        self._file.write(text)
        self._file.flush()

    @property
    def closed(self) -> bool:
        return self._file is None

    def close(self) -> None:
        with self.lock:
            if self._file is None:
                return
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None
