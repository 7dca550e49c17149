"""Stop strings in streamed text, shared by the engine that streams and the gateway that relays.

Text streams out before the engine knows whether a stop string completes; whoever emits pieces
must hold back a tail that could still grow into one, or a client sees its first half.
"""

from __future__ import annotations

from collections.abc import Sequence


def partial_stop(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that could still grow into one of ``stops``."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


class StopHoldBack:
    """Streamed text → what may leave now. A tail that could still grow into one of ``stops``
    waits for the next text; the longest such tail lies within it plus the new text (it was the
    longest such tail before), so each call tests only that short text."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.held = ""

    def push(self, text: str) -> str:
        text = self.held + text
        keep = partial_stop(text, self.stops) if self.stops else 0
        piece, self.held = text[: len(text) - keep], text[len(text) - keep :]
        return piece
