"""Trajectory <-> ZeroMQ frames: msgpack for the metadata, raw little-endian arrays for tokens.

Token lists as msgpack lists cost 10-30x the wire time (measured on a 2-core CPU machine); as raw
bytes they keep most of it. A message is two frames, ``[header, payload]``: the header (msgpack)
carries everything but the token arrays, plus each array's dtype and length and the payload's
XXH3-64 digest; the payload is the arrays' bytes end to end, each padded to 8 bytes so every
array starts aligned. A truncated, swapped or corrupted frame fails loudly in ``decode`` instead
of training on garbage. Never pickle: a queue peer must not be able to run code in the trainer.

A sample's arrays already have the wire's types (:data:`areal.core.types.SAMPLE_DTYPES`: int32
ids and versions, uint8 mask, float32 log-probs), so ``encode`` copies their memory once into
the payload, and ``decode`` gives back read-only arrays over the received bytes: no per-token
Python work on either side. One payload frame, not one per array: every ZeroMQ frame costs
each side several microseconds of Python, more than copying its bytes. The digest is XXH3
rather than CRC-32 because it runs at memory speed (4 us for the 106 KB of an 8k-token sample,
against 55 us for ``zlib.crc32``). A completion's fields (the raw turns, sent only on request)
are lists and are converted here; ids, versions or masks outside their type's range are
rejected at ``encode``.

The header is a typed record (:class:`Header`) that msgspec packs and, on the way in, parses and
checks in one C pass: every field's type, counts that are not negative, finite numbers, no
unknown field in a sample's or a turn's record. The same checks in Python after ``msgpack``
took ~5 us of a decode's ~15 (an 8k-token trajectory), on the consumer's busiest thread.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
import numpy as np
import xxhash

from areal.core.types import (
    SAMPLE_DTYPES,
    Completion,
    Sample,
    Trajectory,
    TurnSpan,
    as_token_array,
)

FORMAT = "areal.trajectory/2"

WireDtype = Literal["<i4", "u1", "<f4"]
# (field, wire dtype) of each array, in frame order.
SAMPLE_ARRAYS: tuple[tuple[str, WireDtype], ...] = (
    ("input_ids", "<i4"),
    ("loss_mask", "u1"),
    ("logprobs", "<f4"),
    ("versions", "<i4"),
)
assert [(n, np.dtype(d)) for n, d in SAMPLE_ARRAYS] == list(SAMPLE_DTYPES.items())
_DTYPES = {dtype: np.dtype(dtype) for _, dtype in SAMPLE_ARRAYS}
TURN_ARRAYS: tuple[tuple[str, WireDtype], ...] = (
    ("prompt_ids", "<i4"),
    ("output_ids", "<i4"),
    ("output_logprobs", "<f4"),
    ("output_versions", "<i4"),
)
_SAMPLE_DTYPES = [dtype for _, dtype in SAMPLE_ARRAYS]
_TURN_DTYPES = [dtype for _, dtype in TURN_ARRAYS]


class CodecError(ValueError):
    """A trajectory that cannot be encoded, or frames that are not a valid encoded trajectory."""


# --- the header -------------------------------------------------------------------------------

Count = Annotated[int, msgspec.Meta(ge=0)]
# Finite: NaN fails both bounds, the infinities one (an int is taken and becomes a float).
Number = Annotated[float, msgspec.Meta(ge=-sys.float_info.max, le=sys.float_info.max)]


class SampleHeader(msgspec.Struct, forbid_unknown_fields=True):
    """A sample's fields other than its arrays."""

    reward: Number
    completion_ids: list[str]
    temperature: Number
    # Each turn's generated tokens and return: (turn, start, end, return); checked by Sample.
    turns: list[tuple[Count, Count, Count, Number]] = msgspec.field(default_factory=list)


class TurnHeader(msgspec.Struct, forbid_unknown_fields=True):
    """A completion's fields other than its arrays."""

    completion_id: str
    session_id: str | None
    turn: Count
    model: str
    finish_reason: str
    reward: Number | None
    created: Number
    sampling: dict[str, Any]


class Header(msgspec.Struct):
    """The header frame: everything but the token arrays, plus each array's dtype and length and
    the payload's digest. A msgpack map (its keys are the field names)."""

    format: str
    session_id: str
    reward: Number | None
    completions: Count
    metadata: dict[str, Any]
    created: Number
    samples: list[SampleHeader]
    turns: list[TurnHeader]
    arrays: list[tuple[WireDtype, Count]]
    digest: Count  # XXH3-64 of the payload


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Header)


def digest(frame: Any) -> int:
    """The XXH3-64 of a frame's bytes (anything with the buffer protocol)."""
    return xxhash.xxh3_64_intdigest(frame)


ALIGN = 8  # each array of the payload starts at a multiple of this many bytes
_PADDING = bytes(ALIGN)


def _padded(nbytes: int) -> int:
    return nbytes + -nbytes % ALIGN


@dataclass(frozen=True, slots=True)
class Encoded:
    """One trajectory, encoded but not yet joined: the header frame and the payload's pieces
    (each array's memory, then its padding), which a sender copies once into whatever frame
    carries them (one trajectory's, or a whole message's)."""

    header: bytes
    parts: list[Any]
    size: int  # the payload's bytes

    @property
    def wire_bytes(self) -> int:
        """The header's and the payload's bytes: what the trajectory takes on the wire."""
        return len(self.header) + self.size

    def frames(self) -> list[bytes]:
        return [self.header, b"".join(self.parts)]


def encode(trajectory: Trajectory) -> list[bytes]:
    """The two frames of one trajectory: a msgpack header and the payload of its arrays (4 per
    sample, then 4 per turn)."""
    return encode_parts(trajectory).frames()


class _Payload:
    """The payload's parts and layout as they are added, with the digest streamed over them."""

    __slots__ = ("hasher", "layout", "parts", "size")

    def __init__(self) -> None:
        self.parts: list[Any] = []  # each array's bytes, then its padding
        self.layout: list[tuple[WireDtype, int]] = []  # (dtype, length) per array
        self.hasher = xxhash.xxh3_64()
        self.size = 0

    def add(self, record: Any, fields: tuple[tuple[str, WireDtype], ...], where: str) -> None:
        for name, dtype in fields:
            values = getattr(record, name)
            if not isinstance(values, np.ndarray):  # a completion's list (a sample has arrays)
                try:
                    values = as_token_array(values, _DTYPES[dtype], f"{where}.{name}")
                except ValueError as err:
                    raise CodecError(str(err)) from err
            data = values.data  # its bytes (1-D, contiguous, the wire dtype), no copy
            self.hasher.update(data)
            self.parts.append(data)
            padding = _PADDING[: -data.nbytes % ALIGN]
            if padding:
                self.hasher.update(padding)
                self.parts.append(padding)
            self.size += data.nbytes + len(padding)
            self.layout.append((dtype, len(values)))


def encode_parts(trajectory: Trajectory) -> Encoded:
    """``encode`` without joining the payload: its digest is streamed over the arrays' memory,
    so the only copy of the tokens is the sender's, into the frame that goes out."""
    payload = _Payload()
    samples = []
    for i, sample in enumerate(trajectory.samples):
        payload.add(sample, SAMPLE_ARRAYS, f"samples[{i}]")
        spans = [(t.turn, t.start, t.end, t.ret) for t in sample.turns]
        samples.append(
            SampleHeader(sample.reward, sample.completion_ids, sample.temperature, spans)
        )
    turns = []
    for i, turn in enumerate(trajectory.turns):
        payload.add(turn, TURN_ARRAYS, f"turns[{i}]")
        turns.append(
            TurnHeader(
                turn.completion_id,
                turn.session_id,
                turn.turn,
                turn.model,
                turn.finish_reason,
                turn.reward,
                turn.created,
                turn.sampling,
            )
        )
    header = Header(
        FORMAT,
        trajectory.session_id,
        trajectory.reward,
        trajectory.completions,
        trajectory.metadata,
        trajectory.created,
        samples,
        turns,
        payload.layout,
        payload.hasher.intdigest(),
    )
    try:
        packed = _ENCODER.encode(header)
    except (TypeError, ValueError, OverflowError) as err:
        raise CodecError(
            f"trajectory {trajectory.session_id!r} has metadata msgpack cannot carry: {err}"
        ) from err
    return Encoded(packed, payload.parts, payload.size)


def _read_header(frame: Any) -> Header:
    """The header frame, parsed and type-checked; ``CodecError`` says what is wrong."""
    try:
        return _DECODER.decode(frame)
    except msgspec.ValidationError as err:  # (a DecodeError too: caught first)
        raise CodecError(_invalid_header(frame, err)) from err
    except (msgspec.DecodeError, RecursionError) as err:
        raise CodecError(f"the header frame is not valid msgpack: {err}") from err


def _invalid_header(frame: Any, err: msgspec.ValidationError) -> str:
    """What is wrong with a header that failed its types (the error path only): first whether
    it is a header of this format at all."""
    try:
        untyped = msgspec.msgpack.decode(frame)
    except (msgspec.DecodeError, RecursionError) as bad:  # past the first wrong type
        return f"the header frame is not valid msgpack: {bad}"
    if not isinstance(untyped, dict) or untyped.get("format") != FORMAT:
        found = untyped.get("format") if isinstance(untyped, dict) else type(untyped).__name__
        return f"the header frame is not an {FORMAT} header (found {found!r})"
    return f"the header does not describe a valid trajectory: {err}"


def _arrays(header: Header, frames: Sequence[Any]) -> list[Any]:
    """The header's arrays, as read-only views of the payload frame."""
    if len(frames) != 1:
        raise CodecError(f"expected one payload frame after the header, got {len(frames)}")
    payload = memoryview(frames[0]).cast("B")  # bytes, a ZeroMQ buffer or an array: its bytes
    spans, size = [], 0  # (dtype, length, offset) of each array; the payload's size
    for dtype, length in header.arrays:
        kind = _DTYPES[dtype]
        spans.append((kind, length, size))
        size += _padded(length * kind.itemsize)
    if len(payload) != size:
        raise CodecError(f"the payload has {len(payload)} bytes, its header's arrays take {size}")
    if digest(payload) != header.digest:
        raise CodecError("the payload is corrupted (XXH3-64 mismatch)")
    return [np.frombuffer(payload, dtype=k, count=n, offset=at) for k, n, at in spans]


def decode(frames: Sequence[Any]) -> Trajectory:
    """The trajectory ``encode`` made; ``CodecError`` names what is wrong with bad frames.

    ``frames`` are bytes or anything with the buffer protocol (a ZeroMQ frame's buffer): the
    samples' arrays are read-only views of the payload.
    """
    if not frames:
        raise CodecError("no frames: an encoded trajectory has at least a header frame")
    header = _read_header(frames[0])
    if header.format != FORMAT:
        raise CodecError(f"the header frame is not an {FORMAT} header (found {header.format!r})")
    expected = _SAMPLE_DTYPES * len(header.samples) + _TURN_DTYPES * len(header.turns)
    if [dtype for dtype, _ in header.arrays] != expected:
        raise CodecError(
            f"the header lists arrays that do not match its {len(header.samples)} "
            f"samples and {len(header.turns)} turns"
        )
    columns = _arrays(header, frames[1:])
    try:
        # The views have the wire's dtypes, which are the sample's: no conversion to check.
        samples = [
            Sample.of_wire_arrays(columns[4 * i : 4 * i + 4], s.reward, s.completion_ids,
                                  s.temperature, [TurnSpan(*t) for t in s.turns])
            for i, s in enumerate(header.samples)
        ]  # fmt: skip
    except ValueError as err:  # arrays of different lengths, a temperature not above 0, spans
        raise CodecError(f"the header does not describe a valid trajectory: {err}") from err
    turns = []
    at = 4 * len(samples)
    for t in header.turns:  # a completion holds lists, as the engine's answer did
        prompt, output, logprobs, versions = (a.tolist() for a in columns[at : at + 4])
        at += 4
        turns.append(
            Completion(t.completion_id, t.session_id, t.turn, t.model, prompt, output, logprobs,
                       versions, t.finish_reason, t.reward, t.created, t.sampling)
        )  # fmt: skip
    return Trajectory(
        session_id=header.session_id,
        samples=samples,
        reward=header.reward,
        completions=header.completions,
        metadata=header.metadata,
        created=header.created,
        turns=turns,
    )
