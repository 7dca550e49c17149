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
