"""``gateway.log``: one line per request, secrets never included.

    2026-11-29T14:23:01.221 session=s_3f2a model=your-policy-model-id route=local status=200 latency_ms=12.4 retries=0 path=/v1/chat/completions

``route`` is ``local`` for the policy's engines, else the upstream channel's host, so
``grep taotoken gateway.log`` finds the calls that went through the channel.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, TextIO

from areal.host.redact import redact


class AccessLog:
    def __init__(self, path: str | Path | None, secrets: tuple[str, ...] = ()) -> None:
        self.path = Path(path) if path else None
        self.secrets = secrets
        self._lock = threading.Lock()
        self._file: TextIO | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", buffering=1, encoding="utf-8")

    def write(self, **fields: Any) -> None:
        if self._file is None:
            return
        now = time.time()
        stamp = (
            time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now))
            + f".{int(now * 1000) % 1000:03d}"
        )
        parts = [stamp] + [f"{k}={_value(v)}" for k, v in fields.items()]
        line = redact(" ".join(parts), self.secrets)
        with self._lock:
            self._file.write(line + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    text = str(value)
    return text.replace(" ", "_") if text else "-"
