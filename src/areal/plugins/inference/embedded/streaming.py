"""Incremental stream chunks: the text, ids and log-probs a streamed request has gained since its
last chunk, so a stream of n tokens costs O(n) bytes and CPU rather than O(n²).

SGLang streams the whole output so far by default and only the new part with
``--incremental-streaming-output``; the embedded engine streams the new part by default (see
docs/inference.md). Text is the delicate part: a piece once sent cannot be taken back, so a piece
leaves only when it ends on a whole character and cannot be the start of a stop string (the final
text drops a matched stop string), and the last piece is cut from the final text itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from areal.core.stop_strings import StopHoldBack

log = logging.getLogger("areal.inference")


class IncrementalDetokenizer:
    """The text a growing token list adds, decoding a few tokens at a time.

    Decoding all of the output for every new token costs O(n) per token. This decodes a window
    that starts one emission back (so a tokenizer that drops the leading space of a window's
    first token treats both decodes alike) and gives text only when it does not end in U+FFFD
    (a multi-byte character still missing bytes), whose later bytes would change it.
    """

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.prefix = 0  # window start, in output tokens
        self.read = 0  # output tokens already turned into text

    def step(self, full_ids: list[int], start: int) -> str:
        """New text of ``full_ids[start:]`` (the output) since the last call that returned some."""
        done = self.decode(full_ids[start + self.prefix : start + self.read])
        now = self.decode(full_ids[start + self.prefix :])
        if len(now) <= len(done) or now.endswith("\ufffd") or not now.startswith(done):
            return ""
        self.prefix, self.read = self.read, len(full_ids) - start
        return now[len(done) :]


class TextChunker:
    """The text pieces of one stream: detokenized, held back at a possible stop string, and
    closed by the final text so that the pieces join to exactly it."""

    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str]) -> None:
        self.detokenizer = IncrementalDetokenizer(decode)
        self.hold = StopHoldBack(stops)  # decoded text that may be the start of a stop string
        self.pieces: list[str] = []

    def step(self, full_ids: list[int], start: int) -> str:
        """The piece to send after a new token ('' when nothing is certain yet)."""
        piece = self.hold.push(self.detokenizer.step(full_ids, start))
        if piece:
            self.pieces.append(piece)
        return piece

    def finish(self, final_text: str, rid: str) -> str:
        """The last piece: what ``final_text`` adds to the pieces already sent."""
        sent = "".join(self.pieces)
        if not final_text.startswith(sent):
            log.warning(
                "request %s: the streamed text is not a prefix of the final text (the tokenizer "
                "decodes a window differently from the whole output); the stream's text differs",
                rid,
            )
        return final_text[len(sent) :]
