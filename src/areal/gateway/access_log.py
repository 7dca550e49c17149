"""``gateway.log``: one line per request, secrets never included.

    2026-11-29T14:23:01.221 session=s_3f2a model=your-policy-model-id route=local status=200 latency_ms=12.4 retries=0 path=/v1/chat/completions

``route`` is ``local`` for the policy's engines, else the upstream channel's host, so
``grep taotoken gateway.log`` finds the calls that went through the channel.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from pathlib import Path
from typing import Any, TextIO

_SECRET = re.compile(r"(sk-|ak-|key-|Bearer\s+)[A-Za-z0-9._\-]{6,}")


# A piece of a secret this long is redacted too: providers echo part of a key they refuse. Shorter
# pieces would hide ordinary words of the log when a key holds one.
SECRET_PIECE = 12


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """Remove known secrets, any piece of one of ``SECRET_PIECE`` characters or more, and
    anything shaped like an API key from ``text``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
            text = _redact_pieces(text, secret)
    return _SECRET.sub(lambda m: m.group(1) + "***", text)


def _redact_pieces(text: str, secret: str) -> str:
    """Replace every run of ``text`` made of overlapping ``SECRET_PIECE``-long pieces of
    ``secret`` with ``***``."""
    if len(secret) < SECRET_PIECE or len(text) < SECRET_PIECE:
        return text
    if not _any_piece(secret).search(text):  # the usual case, in C: no piece of it at all
        return text
    pieces = _pieces(secret)
    hidden = [False] * len(text)
    for i in range(len(text) - SECRET_PIECE + 1):
        if text[i : i + SECRET_PIECE] in pieces:
            hidden[i : i + SECRET_PIECE] = [True] * SECRET_PIECE
    if not any(hidden):
        return text
    out: list[str] = []
    for i, char in enumerate(text):
        if not hidden[i]:
            out.append(char)
        elif i == 0 or not hidden[i - 1]:
            out.append("***")
    return "".join(out)


@functools.lru_cache(maxsize=32)
def _pieces(secret: str) -> frozenset[str]:
    """Every ``SECRET_PIECE``-long piece of ``secret`` (once per secret: the gateway redacts
    every log line with the same few keys)."""
    return frozenset(secret[i : i + SECRET_PIECE] for i in range(len(secret) - SECRET_PIECE + 1))


@functools.lru_cache(maxsize=32)
def _any_piece(secret: str) -> re.Pattern[str]:
    """A pattern matching any of ``secret``'s pieces."""
    return re.compile("|".join(re.escape(piece) for piece in sorted(_pieces(secret))))


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
