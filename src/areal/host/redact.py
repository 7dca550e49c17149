"""Secrets out of text: what a log line, an error message or a trace may show of a key.

Used by every writer of text a person or a file will see: the gateway's access log and its
upstream errors, the channel probe, the plugin trace. Known secrets are replaced whole and by
piece (a provider echoes part of a key it refuses), and anything shaped like an API key goes too.
"""

from __future__ import annotations

import functools
import re

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
