"""Property: the trajectory queue's consumer counts and skips every malformed message, delivers
every valid trajectory exactly once, and keeps going.

Hypothesis sends at least 1,000 bad messages, on real ZeroMQ sockets, to one
``ZmqTrajectorySource``, interleaved with valid trajectories and with resends of them: random
bytes in place of a trajectory's header and payload, truncated headers and arrays, an emptied
header or payload, bytes added to one, the two swapped, a flipped bit, headers with a field of
the wrong type or missing, a wrong format, a wrong tag, too few frames, envelopes of the wrong
size, sizes in the envelope that do not add up to the frames, a frame too many or too few after
the envelope, and bad messages that claim a high ``low`` (which must not make the consumer forget
what it acknowledged). A put message carries several trajectories, so a bad one often travels
between valid ones: a trajectory that does not decode is answered with a NACK for its sequence
number alone and its neighbours are delivered; a message whose envelope does not match its
frames is refused whole (a NACK naming each of its sequence numbers). Every refusal is counted in ``rejected``; a message that is not a put at all
gets no answer and is counted too; a valid trajectory is acknowledged and handed out by ``get``,
equal to what was sent, once; a resend is acknowledged and counted in ``duplicates``.
Afterwards a real sink still delivers.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from areal.core.types import Completion, Sample, Trajectory
from areal.plugins.queues import codec
from areal.plugins.queues.zmq_queue import ACK, NACK, PUT, ZmqTrajectorySink, ZmqTrajectorySource
from support import eventually

EXAMPLES = 1000
SENT: Counter[str] = Counter()  # messages sent per kind, to prove the count
FUZZ = settings(settings.get_profile("areal-fuzz"), max_examples=EXAMPLES)
REPLY_TIMEOUT_MS = 5000

# --- valid trajectories --------------------------------------------------------------------------

TEXT = st.text(max_size=8)
INT32 = st.integers(-(2**31), 2**31 - 1)
LOGPROB = st.floats(-50, 0, width=32)  # float32 values travel exactly
FINITE = st.floats(allow_nan=False, allow_infinity=False)
LEAF = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), FINITE, TEXT)
META = st.recursive(
    LEAF,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)


@st.composite
def samples(draw: st.DrawFn) -> Sample:
    n = draw(st.integers(0, 6))
    return Sample(
        input_ids=draw(st.lists(INT32, min_size=n, max_size=n)),
        loss_mask=draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)),
        logprobs=draw(st.lists(LOGPROB, min_size=n, max_size=n)),
        versions=draw(st.lists(INT32, min_size=n, max_size=n)),
        reward=draw(FINITE),
        completion_ids=draw(st.lists(TEXT, max_size=2)),
        temperature=draw(st.floats(min_value=0.01, max_value=10)),
    )


@st.composite
def turns(draw: st.DrawFn) -> Completion:
    n = draw(st.integers(0, 3))
    return Completion(
        completion_id=draw(TEXT),
        session_id=draw(st.none() | TEXT),
        turn=draw(st.integers(0, 100)),
        model=draw(TEXT),
        prompt_ids=draw(st.lists(INT32, max_size=4)),
        output_ids=draw(st.lists(INT32, min_size=n, max_size=n)),
        output_logprobs=draw(st.lists(LOGPROB, min_size=n, max_size=n)),
        output_versions=draw(st.lists(INT32, min_size=n, max_size=n)),
        finish_reason=draw(st.sampled_from(["stop", "length", "abort"])),
        reward=draw(st.none() | FINITE),
        created=draw(FINITE),
        sampling=draw(st.dictionaries(TEXT, LEAF, max_size=3)),
    )


TRAJECTORIES = st.builds(
    Trajectory,
    session_id=TEXT,
    samples=st.lists(samples(), max_size=3),
    reward=st.none() | FINITE,
    completions=st.integers(0, 10),
    metadata=st.dictionaries(TEXT, META, max_size=3),
    created=FINITE,
    turns=st.lists(turns(), max_size=2),
)


# --- bad messages --------------------------------------------------------------------------------


@dataclass
class Bad:
    """A damaged trajectory (its header and payload, as a put message carries them) or, when
    ``whole``, a whole message; and how the consumer answers: ``level`` is "trajectory" (a
    NACK for its seq only), "message" (the message's frames do not match its envelope: a NACK
    for every seq), "envelope" (unreadable: a NACK without a seq) or "none" (not a put: no
    answer)."""

    why: str
    frames: list[bytes]  # [header, payload]; or the whole message, when ``whole``
    level: str = "trajectory"
    whole: bool = False  # ``frames`` is the whole message: no PUT or envelope added
    envelope: bytes | None = None  # in place of the one the producer would write
    low: int | None = None  # the low the message claims (default: its lowest seq)
    claim: tuple[int, int] | None = None  # the header and payload sizes its envelope claims
    frames_after: int = 2  # frames after the envelope: the headers, the payloads (and junk)

    def __repr__(self) -> str:
        shown = [f[:40] for f in self.frames[:5]]
        return f"<{self.why}: {len(self.frames)} frames {shown!r}>"


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def header_of(frames: list[bytes]) -> dict[str, Any]:
    return msgpack.unpackb(frames[0], raw=False, strict_map_key=False)


NOT_STR = META.filter(lambda v: not isinstance(v, str))
NOT_NUMBER = st.one_of(
    META.filter(lambda v: isinstance(v, bool) or not isinstance(v, (int, float))),
    st.sampled_from([float("nan"), float("inf"), float("-inf")]),
)
NOT_COUNT = st.one_of(
    META.filter(lambda v: isinstance(v, bool) or not isinstance(v, int)),
    st.integers(-(2**63), -1),  # msgpack carries 64-bit integers
)
NOT_MAP = META.filter(lambda v: not isinstance(v, dict)) | st.dictionaries(
    st.integers(-(2**63), 2**63 - 1), LEAF, min_size=1, max_size=2
)
NOT_LIST = META.filter(lambda v: not isinstance(v, list))
# A wrong value for each header field: the trajectory's, a sample's, a turn's.
HEADER_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "session_id": NOT_STR,
    "reward": NOT_NUMBER.filter(lambda v: v is not None),
    "completions": NOT_COUNT,
    "metadata": NOT_MAP,
    "created": NOT_NUMBER,
    "samples": NOT_LIST,
    "turns": NOT_LIST,
    "arrays": NOT_LIST | st.just([[1, 2, 3]]) | st.just([["<i4", -1, 0]]),
}
SAMPLE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "reward": NOT_NUMBER,
    "completion_ids": NOT_LIST | st.lists(NOT_STR, min_size=1, max_size=2),
    "temperature": NOT_NUMBER | st.floats(max_value=0),
}
TURN_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "completion_id": NOT_STR,
    "turn": NOT_COUNT,
    "model": NOT_STR,
    "finish_reason": NOT_STR,
    "created": NOT_NUMBER,
    "sampling": NOT_MAP,
}
REQUIRED = ["session_id", "samples", "turns", "arrays", "completions", "reward", "format"]


def one_of_keys(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[tuple[str, Any]]:
    names = st.sampled_from(sorted(fields))

    @st.composite
    def build(draw: st.DrawFn) -> tuple[str, Any]:
        name = draw(names)
        return name, draw(fields[name])

    return build()


HEADER_VALUES, SAMPLE_VALUES, TURN_VALUES = (
    one_of_keys(f) for f in (HEADER_FIELDS, SAMPLE_FIELDS, TURN_FIELDS)
)
KINDS = st.sampled_from(
    [
        "random frames",
        "truncated header",
        "truncated array",
        "emptied frame",
        "bytes added",
        "swapped frames",
        "flipped bit",
        "wrong header type",
        "wrong header type",
        "wrong header type",
        "missing header key",
        "header not a map",
        "wrong format",
        "wrong tag",
        "too few frames",
        "frames after the envelope",
        "sizes that do not add up",
        "envelope of the wrong size",
    ]
)


@st.composite
def bad_messages(draw: st.DrawFn) -> Bad:
    frames = [bytes(frame) for frame in codec.encode(draw(TRAJECTORIES))]  # to damage them
    kind = draw(KINDS)
    bad = _damage(draw, kind, frames)
    if bad.level in ("trajectory", "message") and draw(st.booleans()):
        bad.low = 2**64 - 1  # "forget everything below": must not count from a bad put
        bad.why += " (claiming a high low)"
    return bad


def _damage(draw: st.DrawFn, kind: str, frames: list[bytes]) -> Bad:
    header, payload = frames
    filled = [1] if payload else []  # the payload, when the trajectory has tokens
    if kind == "random frames":
        junk = draw(st.lists(st.binary(max_size=64), min_size=2, max_size=2))
        return Bad(kind, junk)
    if kind == "truncated header":
        return Bad(kind, [header[: draw(st.integers(0, len(header) - 1))], payload])
    if kind == "truncated array" and filled:
        return Bad(kind, [header, payload[: draw(st.integers(0, len(payload) - 1))]])
    if kind == "emptied frame":  # an empty payload is what a trajectory without tokens has
        if payload and draw(st.booleans()):
            return Bad("the payload emptied", [header, b""])
        return Bad("the header emptied", [b"", payload])
    if kind == "bytes added":
        extra = draw(st.binary(min_size=1, max_size=16))
        if draw(st.booleans()):
            return Bad("bytes after the header", [header + extra, payload])
        return Bad("bytes after the payload", [header, payload + extra])
    if kind == "swapped frames" and header != payload:
        return Bad("header and payload swapped", [payload, header])
    if kind == "flipped bit" and filled:
        at = draw(st.integers(0, len(payload) - 1))
        bit = 1 << draw(st.integers(0, 7))
        flipped = payload[:at] + bytes([payload[at] ^ bit]) + payload[at + 1 :]
        return Bad("a bit flipped in the payload", [header, flipped])
    if kind in ("wrong header type", "truncated array", "flipped bit", "swapped frames"):
        return _wrong_type(draw, frames)
    if kind == "missing header key":
        header = header_of(frames)
        key = draw(st.sampled_from(REQUIRED))
        header.pop(key)
        return Bad(f"header without {key}", [pack(header), *frames[1:]])
    if kind == "header not a map":
        value = draw(META.filter(lambda v: not isinstance(v, dict)))
        return Bad("header not a map", [pack(value), *frames[1:]])
    if kind == "wrong format":
        header = header_of(frames)
        header["format"] = draw(META.filter(lambda v: v != codec.FORMAT))
        return Bad("wrong format", [pack(header), *frames[1:]])
    if kind == "wrong tag":
        tag = draw(
            st.one_of(st.binary(max_size=12), st.just(b"areal.put/2")).filter(lambda t: t != PUT)
        )
        envelope = draw(st.binary(min_size=16, max_size=16))
        return Bad("wrong tag", [tag, envelope, *frames], level="none", whole=True)
    if kind == "too few frames":
        return Bad(kind, [PUT], level="none", whole=True)
    if kind == "frames after the envelope":  # not the two (headers, payloads)
        count = draw(st.sampled_from([0, 1, 3]))
        return Bad(
            f"{count} frames after the envelope", frames, level="message", frames_after=count
        )
    if kind == "sizes that do not add up":
        off = st.integers(-len(header), 64), st.integers(-len(payload), 64)
        more_header, more_payload = draw(st.tuples(*off).filter(lambda d: d != (0, 0)))
        claim = (len(header) + more_header, len(payload) + more_payload)
        return Bad(f"sizes {claim} claimed", frames, level="message", claim=claim)
    # "envelope of the wrong size": not low then whole (seq, header, payload) triples of 8-byte
    # numbers, or no triple at all
    size = draw(st.integers(0, 80).filter(lambda n: n < 32 or (n - 8) % 24))
    envelope = draw(st.binary(min_size=size, max_size=size))
    return Bad(kind, frames, level="envelope", envelope=envelope)


def _wrong_type(draw: st.DrawFn, frames: list[bytes]) -> Bad:
    header = header_of(frames)
    where = draw(st.sampled_from(["header", "sample", "turn"]))
    if where == "sample" and header["samples"]:
        i = draw(st.integers(0, len(header["samples"]) - 1))
        key, value = draw(SAMPLE_VALUES)
        header["samples"][i][key] = value
        why = f"samples[{i}].{key} of a wrong type"
    elif where == "turn" and header["turns"]:
        i = draw(st.integers(0, len(header["turns"]) - 1))
        key, value = draw(TURN_VALUES)
        header["turns"][i][key] = value
        why = f"turns[{i}].{key} of a wrong type"
    else:
        key, value = draw(HEADER_VALUES)
        header[key] = value
        why = f"{key} of a wrong type"
    return Bad(why, [pack(header), *frames[1:]])


# --- the property --------------------------------------------------------------------------------


def split_seqs(frame: bytes) -> list[bytes]:
    """A reply's seq frame as its 8-byte sequence numbers."""
    assert len(frame) % 8 == 0, f"a seq frame of {len(frame)} bytes"
    return [frame[i : i + 8] for i in range(0, len(frame), 8)]


def u64(value: int) -> bytes:
    return value.to_bytes(8, "big")


def put_message(
    low: bytes,
    items: list[tuple[bytes, list[bytes]]],
    bad: Bad | None = None,
    bad_seq: bytes | None = None,
) -> list[bytes]:
    """A put message as ``ZmqTrajectorySink`` writes one, built here from the wire format
    (docs/training.md): ``[PUT, envelope, headers, payloads]``; the envelope is ``low`` then
    (seq, header bytes, payload bytes) per trajectory. ``bad`` (the trajectory ``bad_seq``) may
    claim other sizes for itself, or put another number of frames after the envelope."""
    entries = [low]
    for seq, (header, payload) in items:
        claimed = (len(header), len(payload))
        if bad is not None and bad.claim is not None and seq == bad_seq:
            claimed = bad.claim
        entries += [seq, u64(claimed[0]), u64(claimed[1])]
    after = [b"".join(h for _, (h, _) in items), b"".join(p for _, (_, p) in items), b"junk"]
    frames_after = bad.frames_after if bad is not None else 2
    return [PUT, b"".join(entries), *after[:frames_after]]


@dataclass
class Producer:
    """A raw producer (a DEALER) numbering its trajectories as ``ZmqTrajectorySink`` does."""

    sock: zmq.Socket
    source: ZmqTrajectorySource
    seq: int = 0
    last_valid: list[tuple[bytes, list[bytes]]] | None = None  # (seq, frames) delivered last

    def next_seq(self) -> bytes:
        self.seq += 1
        return u64(self.seq)

    def replies(self, seqs: int) -> tuple[list[bytes], list[tuple[bytes, list[bytes]]]]:
        """The acknowledged seqs and the NACKs (reason, seqs) until ``seqs`` are answered."""
        acked: list[bytes] = []
        nacked: list[tuple[bytes, list[bytes]]] = []
        while len(acked) + sum(len(n) for _, n in nacked) < seqs:
            assert self.sock.poll(REPLY_TIMEOUT_MS), "the consumer did not answer"
            kind, *rest = self.sock.recv_multipart()
            if kind == ACK:
                assert len(rest) == 1, f"an ack is one frame of seqs, got {rest!r}"
                acked += split_seqs(rest[0])
            else:
                assert kind == NACK and len(rest) == 2 and rest[0], (
                    f"{kind!r} {rest!r}: a NACK needs a reason and its seqs"
                )
                nacked.append((rest[0], split_seqs(rest[1])))
        return acked, nacked

    def put(self, bad: Bad | None, before: list[Trajectory], after: list[Trajectory]) -> None:
        """One put message: the ``before`` trajectories, the bad one, the ``after`` ones."""
        counters = self.source.counters()
        valid = [(self.next_seq(), t) for t in before]
        bad_seq = self.next_seq() if bad is not None else None
        valid += [(self.next_seq(), t) for t in after]
        items = [(seq, [bytes(f) for f in codec.encode(t)]) for seq, t in valid[: len(before)]]
        if bad is not None and bad_seq is not None:
            items.append((bad_seq, bad.frames))
        items += [(seq, [bytes(f) for f in codec.encode(t)]) for seq, t in valid[len(before) :]]
        seqs = [seq for seq, _ in items]
        low = u64(bad.low) if bad is not None and bad.low is not None else min(seqs)
        message = put_message(low, items, bad, bad_seq)
        if bad is not None and bad.envelope is not None:
            message[1] = bad.envelope
        self.sock.send_multipart(message)
        level = bad.level if bad is not None else "none"
        if level == "envelope":
            assert self.replies(0) == ([], [])
            assert self.sock.poll(REPLY_TIMEOUT_MS), f"no answer to {bad!r}"
            kind, *rest = self.sock.recv_multipart()
            assert kind == NACK and len(rest) == 1 and rest[0], f"{rest!r} for {bad!r}"
            rejected, delivered = 1, []
        elif level == "message":
            acked, nacked = self.replies(len(seqs))
            assert acked == [] and [n for _, n in nacked] == [seqs], f"{nacked!r} for {bad!r}"
            rejected, delivered = len(seqs), []
        else:
            acked, nacked = self.replies(len(seqs))
            expected = [[bad_seq]] if bad is not None else []
            assert [n for _, n in nacked] == expected, f"{nacked!r} for {bad!r}"
            assert acked == [seq for seq, _ in valid], f"acked {acked!r} for {bad!r}"
            rejected, delivered = len(expected), [t for _, t in valid]
        for trajectory in delivered:
            assert self.source.get(timeout=5) == trajectory, "a trajectory came out different"
        after_counters = self.source.counters()
        assert after_counters["rejected"] == counters["rejected"] + rejected, bad
        assert after_counters["received"] == counters["received"] + len(delivered), bad
        assert after_counters["buffered"] == 0
        if delivered:
            self.last_valid = [i for i in items if i[0] != bad_seq]
        SENT["valid"] += len(delivered)
        SENT["bad"] += bad is not None
        SENT["refused"] += rejected

    def resend(self) -> None:
        """The last delivered trajectories again (a producer that missed their acks):
        acknowledged, not delivered."""
        if self.last_valid is None:
            return
        before = self.source.counters()
        seqs = [seq for seq, _ in self.last_valid]
        self.sock.send_multipart(put_message(min(seqs), self.last_valid))
        assert self.replies(len(seqs)) == (seqs, [])
        after = self.source.counters()
        assert after["duplicates"] == before["duplicates"] + len(seqs), "a resend got through"
        assert after["received"] == before["received"] and self.source.buffered == 0
        SENT["resent"] += len(seqs)

    def send_whole(self, bad: Bad) -> None:
        """A message that is not a put: no answer, only the count."""
        before = self.source.counters()
        self.sock.send_multipart(bad.frames)
        eventually(
            lambda: self.source.rejected != before["rejected"],
            REPLY_TIMEOUT_MS / 1000,
            f"{bad!r} counted as rejected",
        )
        assert not self.sock.poll(0), f"an answer to {bad!r}, which is not a put"
        after = self.source.counters()
        assert after["rejected"] == before["rejected"] + 1, f"{bad!r} not counted once"
        assert after["received"] == before["received"] and after["buffered"] == 0, bad
        SENT["bad"] += 1
        SENT["refused"] += 1


@pytest.fixture
def queue() -> Iterator[tuple[ZmqTrajectorySource, Producer]]:
    with (
        ZmqTrajectorySource("tcp://127.0.0.1:*", queue_max_size=8) as source,
        zmq.Context() as ctx,
        ctx.socket(zmq.DEALER) as sock,
    ):
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(source.address)
        yield source, Producer(sock, source)


VALID = st.lists(TRAJECTORIES, max_size=2)
STEPS = st.tuples(bad_messages(), VALID, VALID, st.booleans())


def test_malformed_messages_are_counted_and_skipped_and_the_queue_keeps_going(
    queue: tuple[ZmqTrajectorySource, Producer],
) -> None:
    source, producer = queue
    before = SENT.copy()

    @FUZZ
    @given(STEPS)
    def step(case: tuple[Bad, list[Trajectory], list[Trajectory], bool]) -> None:
        bad, first, then, resend = case
        if bad.whole:
            producer.send_whole(bad)
        else:
            producer.put(bad, first, then)  # between valid trajectories of the same message
        if resend:
            producer.resend()  # after a bad put that claimed a high low, too
        if bad.level != "trajectory" and (first or then):
            producer.put(None, first, then)  # refused with the bad one: they go again

    step()
    sent = SENT - before
    assert sent["bad"] >= EXAMPLES and sent["valid"] >= 100 and sent["resent"] >= 100, sent
    counters = source.counters()
    assert counters["rejected"] == sent["refused"]
    assert counters["received"] == counters["delivered"] == sent["valid"]
    assert counters["duplicates"] == sent["resent"]
    assert source.get(timeout=0.2) is None  # nothing delivered twice, nothing left over

    last = Trajectory("after the fuzz", [Sample([1, 2], [0, 1], [0.0, -0.5], [-1, 3])], 1.0, 1)

    async def real_sink() -> None:
        sink = ZmqTrajectorySink(source.address, close_timeout=5)
        await asyncio.wait_for(sink.put(last), 5)
        await sink.close()

    asyncio.run(real_sink())
    assert source.get(timeout=5) == last
