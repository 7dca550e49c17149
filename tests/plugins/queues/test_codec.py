"""Trajectory <-> frames: exact round trips, the bytes on the wire, and loud failures."""

from __future__ import annotations

import struct

import msgpack
import numpy as np
import pytest
import xxhash

from areal.core.types import Completion, Sample, Trajectory
from areal.plugins.queues.codec import CodecError, decode, encode


def rich_trajectory() -> Trajectory:
    """Two samples (one empty), two turns, unicode and nested metadata, a missing reward."""
    merged = Sample(
        input_ids=[5, 6, 7, 2**31 - 1, 0],
        loss_mask=[0, 0, 1, 1, 1],
        logprobs=[0.0, 0.0, -0.5, -1.25, -3.0],
        versions=[-1, -1, 3, 3, 4],
        reward=0.75,
        completion_ids=["c-1", "c-2"],
        turns=[[0, 2, 4, 0.75], [1, 4, 5, 0.25]],
    )
    empty = Sample(input_ids=[], loss_mask=[], logprobs=[], versions=[], reward=-1.0)
    turns = [
        Completion("c-1", "sess-ü", 0, "policy", [5, 6], [7, 2**31 - 1], [-0.5, -1.25], [3, 3],
                   "stop", reward=None, created=1.5),
        Completion("c-2", None, 1, "политика", [], [], [], [], "length", reward=0.25, created=2.0),
    ]  # fmt: skip
    metadata = {"task": "добавь 2+2 → 4 🤖", "nested": {"ids": [1, 2], "ok": True}, "none": None}
    return Trajectory("sess-ü", [merged, empty], None, 2, metadata, created=12.25, turns=turns)


def test_round_trip_is_exact_with_the_types_the_trainer_expects() -> None:
    sent = rich_trajectory()
    got = decode([bytes(frame) for frame in encode(sent)])
    assert got == sent
    sample = got.samples[0]
    assert [sample.input_ids.dtype, sample.loss_mask.dtype] == [np.int32, np.uint8]
    assert [sample.logprobs.dtype, sample.versions.dtype] == [np.float32, np.int32]
    # Views of the received bytes, not copies: writing to one would change what was received.
    assert not sample.input_ids.flags.writeable
    turn = got.turns[0]  # a completion holds lists, as the engine's answer did
    assert all(type(x) is int for x in turn.prompt_ids + turn.output_ids + turn.output_versions)
    assert all(type(x) is float for x in turn.output_logprobs)


def test_frames_are_a_header_and_little_endian_arrays_in_sample_then_turn_order() -> None:
    sample = Sample(input_ids=[1, 258], loss_mask=[0, 1], logprobs=[0.0, -0.5], versions=[-1, 2])
    header_frame, payload = encode(Trajectory("s", [sample], 1.0, 1))
    assert payload == (
        b"\x01\x00\x00\x00\x02\x01\x00\x00"  # 1, 258 as int32
        + b"\x00\x01" + bytes(6)  # the mask as uint8, padded to 8 bytes
        + b"\x00\x00\x00\x00\x00\x00\x00\xbf"  # 0.0, -0.5 as float32
        + b"\xff\xff\xff\xff\x02\x00\x00\x00"  # -1, 2 as int32
    )  # fmt: skip
    header = msgpack.unpackb(header_frame, strict_map_key=False)
    assert header["format"] == "areal.trajectory/2"
    assert header["arrays"] == [["<i4", 2], ["u1", 2], ["<f4", 2], ["<i4", 2]]
    assert header["digest"] == xxhash.xxh3_64_intdigest(payload)  # the reference XXH3


def test_logprobs_travel_as_float32() -> None:
    sample = Sample(input_ids=[1], loss_mask=[1], logprobs=[-0.1], versions=[0])
    got = decode(encode(Trajectory("s", [sample], 0.0, 1)))
    assert got.samples[0].logprobs.tolist() == [struct.unpack("<f", struct.pack("<f", -0.1))[0]]
    assert got.samples[0].logprobs.tolist() != [-0.1]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda f: [f[0], f[1][:-1]], "the payload has 111 bytes, its header's arrays take 112"),
        (lambda f: [f[0], bytes([f[1][0] ^ 1]) + f[1][1:]], "the payload is corrupted"),
        (lambda f: f[:-1], "expected one payload frame after the header, got 0"),
        (lambda f: [*f, b""], "expected one payload frame after the header, got 2"),
        (lambda f: [b"\xc1garbage", *f[1:]], "the header frame is not valid msgpack"),
        (lambda f: [msgpack.packb({"format": "other/9"}), *f[1:]], "found 'other/9'"),
        (lambda f: [], "no frames"),
    ],
)
def test_damaged_frames_fail_with_a_clear_error(damage, message: str) -> None:
    frames = [bytes(frame) for frame in encode(rich_trajectory())]
    with pytest.raises(CodecError, match=message):
        decode(damage(frames))


def test_header_that_lies_about_the_records_is_rejected() -> None:
    frames = encode(rich_trajectory())
    header = msgpack.unpackb(frames[0], strict_map_key=False)
    del header["samples"][0]["reward"]
    header["samples"][0]["bogus"] = 1
    with pytest.raises(CodecError, match="does not describe a valid trajectory"):
        decode([msgpack.packb(header), *frames[1:]])
    header = msgpack.unpackb(frames[0], strict_map_key=False)
    header["turns"].pop()  # four array frames that no record claims
    with pytest.raises(CodecError, match="do not match its 2 samples and 1 turns"):
        decode([msgpack.packb(header), *frames[1:]])
    header = msgpack.unpackb(frames[0], strict_map_key=False)
    header["samples"][0]["turns"][1][2] = 6  # a turn past the sample's 5 tokens
    with pytest.raises(CodecError, match="turn spans must be ordered, disjoint and inside"):
        decode([msgpack.packb(header), *frames[1:]])
    header = msgpack.unpackb(frames[0], strict_map_key=False)
    header["arrays"][0][0] = "<f8"  # ids that would decode as floats
    with pytest.raises(CodecError, match=r"Invalid enum value '<f8' - at `\$.arrays\[0\]\[0\]`"):
        decode([msgpack.packb(header), *frames[1:]])
    header = msgpack.unpackb(frames[0], strict_map_key=False)
    header["arrays"][0][0] = "u1"  # a known dtype, where the sample's ids should be
    with pytest.raises(CodecError, match="do not match"):
        decode([msgpack.packb(header), *frames[1:]])


def test_values_the_wire_types_cannot_hold_are_refused() -> None:
    # A sample holds the wire's types already: it refuses such values when it is built.
    with pytest.raises(
        ValueError, match=r"input_ids has values in \[2147483648, 2147483648\], outside int32"
    ):
        Sample(input_ids=[2**31], loss_mask=[1], logprobs=[0.0], versions=[0])
    with pytest.raises(ValueError, match=r"loss_mask has values in \[-1, -1\], outside uint8"):
        Sample(input_ids=[1], loss_mask=[-1], logprobs=[0.0], versions=[0])
    sample = Sample(input_ids=[1], loss_mask=[1], logprobs=[0.0], versions=[0])
    with pytest.raises(ValueError, match=r"versions has values .* outside int32"):
        sample.versions = [-(2**40)]  # a later assignment is checked too
    # A completion holds lists: the codec refuses its values at encode.
    turn = Completion("c", "s", 0, "m", [1], [2**31], [0.0], [0], "stop")
    with pytest.raises(CodecError, match=r"turns\[0\].output_ids .* outside int32"):
        encode(Trajectory("s", [sample], 0.0, 1, turns=[turn]))
    with pytest.raises(CodecError, match="metadata msgpack cannot carry"):
        encode(Trajectory("s", [], 0.0, 0, {"x": object()}))
