"""The trajectory queue on ZeroMQ: many producers (gateways, rollout workers), one trainer.

Why acknowledgements: a PUSH socket closed right after its last send was seen to lose that
message (measured here), and a bounded queue must make producers wait rather than drop. So each
producer is a DEALER that numbers its trajectories and keeps them until the consumer (a ROUTER,
bound by the trainer) acknowledges them; ``put`` returns only then.

What is guaranteed (docs/training.md, "Trajectory queue"):

- ``put`` returned  =>  the trajectory is in the consumer's buffer (or already handed out by
  ``get``). The consumer acknowledges only after decoding it and appending it to its buffer.
- Back-pressure: the consumer reads its socket only while it holds fewer than
  ``queue_max_size`` trajectories; beyond that, trajectories wait unacknowledged in ZeroMQ's
  pipes and their ``put`` calls wait. Nothing is dropped.
- Exactly once per consumer: a producer resends its unacknowledged trajectories when it
  reconnects; the consumer drops duplicates by (producer id, sequence number).
- ``close`` waits (up to ``close_timeout``) for every acknowledgement, and raises ``QueueError``
  naming how many are missing rather than returning as if they had arrived.
- Not guaranteed: a consumer that crashes loses what it had acknowledged but not yet handed to
  the trainer (its buffer) unless the trainer persisted it (after ``close``, ``get`` still
  returns the buffer, so a checkpoint can save it); a producer that crashes loses what it had
  sent but not yet seen acknowledged.

Wire format, producer -> consumer: ``[b"areal.put/5", envelope, headers, payloads]``, one
message for every trajectory put while the previous message was going out (up to ``batch_max``
and about ``batch_bytes``). The envelope is 8-byte big-endian numbers: ``low``, then for each
trajectory its sequence number, its header's size and its payload's size; ``headers`` is the
codec's header frames end to end, ``payloads`` its payload frames end to end (each a multiple of
8 bytes, so every array stays aligned in it). ``low`` is the producer's lowest unacknowledged
sequence number (the consumer forgets the ids below it). Consumer -> producer: ``[b"A", seqs]``
(every put of that producer the consumer took since its last reply: one ack message per put
message, not per trajectory) or ``[b"N", reason, seqs]`` for the trajectories of a message it
cannot decode (``[b"N", reason]`` when even the envelope is unreadable); ``seqs`` is their
sequence numbers end to end, 8-byte big-endian, in one frame (put/4 sent a frame per number:
each frame costs both sides a Python call).

Why it is cheap: the token arrays go out and come in without a per-token Python object
(:mod:`areal.plugins.queues.codec`), copied once, into the message's payload frame, and read
where they arrived; puts that queue up travel together, so a burst of trajectories pays one
message's fixed cost on each side (most of a small trajectory's cost): 4 frames, one of them
lent to ZeroMQ, whatever the number of trajectories; acks are batched.
``bench/trajectory_queue.py`` measures it against raw PUSH/PULL of the same bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import struct
import threading
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import zmq
from zmq.utils.monitor import parse_monitor_message

from areal.core.types import Trajectory
from areal.plugins.queues import codec
from areal.plugins.queues.codec import CodecError

log = logging.getLogger(__name__)

PUT = b"areal.put/5"
# Plain ints: pyzmq's enum flags cost microseconds per operation on the hot path.
_NOBLOCK, _EVENTS = int(zmq.NOBLOCK), int(zmq.EVENTS)
_POLLIN, _POLLOUT = int(zmq.POLLIN), int(zmq.POLLOUT)
_MORE = int(zmq.SNDMORE) | _NOBLOCK
# A frame below this size is copied into ZeroMQ's message: cheaper than lending its memory,
# whose release ZeroMQ reports back through pyzmq's garbage-collector thread (pyzmq's own rule).
_LEND_BYTES = 1 << 16
ACK_BATCH = 64  # the most puts one ack message covers (each message is acked when taken)
# default: the most trajectories one put message carries. Small enough that a burst of puts
# spans messages, so one side encodes the next while the other decodes (docs/training.md).
BATCH_MAX = 8
BATCH_BYTES = 1 << 20  # ... and the most bytes past its first: a decoded trajectory keeps its
# message's payload buffer alive (its arrays are views of it), so this bounds what one pins
ACK = b"A"
NACK = b"N"
_PER_PUT = 24  # envelope bytes per trajectory: seq, header bytes, payload bytes


class QueueError(RuntimeError):
    """The queue could not deliver: closed, rejected by the consumer, or acks that never came."""


def _fd(sock: zmq.Socket[bytes]) -> int:
    """The socket's ZMQ_FD: readable when its events may have changed (edge-triggered)."""
    return cast(int, sock.getsockopt(zmq.FD))


def _events(sock: zmq.Socket[bytes]) -> int:
    return cast(int, sock.getsockopt(_EVENTS))


def _send_frames(sock: zmq.Socket[bytes], frames: list[bytes]) -> None:
    """``send_multipart(frames, NOBLOCK, copy=False)`` without its per-frame flag arithmetic on
    pyzmq's enums (~0.5 us a frame, measured; a put message has 2 frames per trajectory).
    Raises ``zmq.Again`` at the high-water mark, before the first frame is queued."""
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        sock.send(frame, _MORE if i < last else _NOBLOCK, copy=len(frame) < _LEND_BYTES)


def _seqs(packed: bytes) -> tuple[int, ...]:
    """The sequence numbers of a reply's seq frame (8-byte big-endian numbers end to end)."""
    return struct.unpack(f">{len(packed) // 8}Q", packed[: len(packed) // 8 * 8])


@dataclass
class _Pending:
    future: asyncio.Future[None]
    encoded: codec.Encoded


class ZmqTrajectorySink:
    """Producer side (``TrajectorySink``): ``put`` returns once the consumer has the trajectory.

    Use it from one event loop; the socket is created on the first ``put``. Counters for metrics:
    ``sent``, ``acked``, ``pending`` (sent or sending, not yet acknowledged), ``resent``,
    ``rejected``, ``messages`` (put messages sent: ``sent / messages`` trajectories travel
    together on average).

    The trainer reads samples only, so a trajectory's raw turns (its completions as generated, a
    second copy of every token) stay behind unless ``send_turns`` asks for them. ``send_hwm``
    is ZeroMQ's high-water mark: how many sent messages may wait in the socket's pipe (not yet
    on the network) before a send waits for room.

    Puts are coalesced: a put joins an outbox, and one sender sends everything waiting there as
    one message (at most ``batch_max`` trajectories and about ``batch_bytes``), so puts made in
    the same event-loop turn, or while the previous message waited for room, share a message. A
    lone put is sent in the next turn of the loop: nothing waits for company.

    The socket is a plain ZeroMQ socket watched by the event loop (``add_reader`` on its
    ``ZMQ_FD``), not a ``zmq.asyncio`` one: a put's send goes straight to ZeroMQ and acks are
    read as they arrive, without a future and an event-loop round per call, which was most of a
    put's cost. ZeroMQ's FD is edge-triggered and any call on the socket may consume its edge,
    so :meth:`_on_socket` also runs after every send.
    """

    def __init__(
        self,
        address: str,
        *,
        close_timeout: float = 30.0,
        send_turns: bool = False,
        send_hwm: int = 1000,
        batch_max: int = BATCH_MAX,
        batch_bytes: int = BATCH_BYTES,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        """``sleep`` times ``close_timeout`` (``asyncio.sleep``; a test passes a fake clock's)."""
        if batch_max < 1:
            raise ValueError(f"batch_max must be at least 1, got {batch_max}")
        self.address = address
        self.close_timeout = close_timeout
        self.send_turns = send_turns
        self.send_hwm = send_hwm
        self.batch_max = batch_max
        self.batch_bytes = batch_bytes
        self._sleep = sleep
        self.sent = 0
        self.acked = 0
        self.resent = 0
        self.rejected = 0
        self.messages = 0
        self._identity = uuid.uuid4().bytes  # stable across reconnects, so resends dedupe
        self._pending: dict[int, _Pending] = {}
        self._settled: asyncio.Event | None = None  # set while nothing is pending
        self._outbox: deque[int] = deque()  # seqs put, not yet sent
        self._sender: asyncio.Task[None] | None = None
        self._next_seq = 0
        self._closed = False
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._sock: zmq.Socket[bytes] | None = None
        self._monitor: zmq.Socket[bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writable: asyncio.Future[None] | None = None  # a send waiting for room
        self._handshakes = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._send_lock: asyncio.Lock | None = None

    @property
    def pending(self) -> int:
        return len(self._pending)

    def counters(self) -> dict[str, int]:
        return {
            "sent": self.sent,
            "acked": self.acked,
            "pending": self.pending,
            "resent": self.resent,
            "rejected": self.rejected,
            "messages": self.messages,
        }

    def _connect(self) -> zmq.Socket[bytes]:
        if self._sock is not None:
            return self._sock
        self._loop = asyncio.get_running_loop()
        self._ctx = zmq.Context()
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.ROUTING_ID, self._identity)
        sock.setsockopt(zmq.LINGER, 0)  # close() waits for acks itself; nothing left to linger
        sock.setsockopt(zmq.SNDHWM, self.send_hwm)
        self._monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        sock.connect(self.address)
        self._sock = sock
        self._send_lock = asyncio.Lock()
        self._settled = asyncio.Event()
        self._loop.add_reader(_fd(sock), self._on_socket)
        self._loop.add_reader(_fd(self._monitor), self._on_monitor)
        self._on_monitor()
        return sock

    def _batches(self, seqs: deque[int]) -> Iterator[list[int]]:
        """Take ``seqs`` from the left in messages' worth, skipping those acknowledged meanwhile
        (a resend of one would be stale)."""
        while seqs:
            batch: list[int] = []
            size = 0
            while seqs and len(batch) < self.batch_max and (not batch or size < self.batch_bytes):
                seq = seqs.popleft()
                entry = self._pending.get(seq)
                if entry is not None:
                    batch.append(seq)
                    size += entry.encoded.wire_bytes
            if batch:
                yield batch

    async def _send(self, seqs: list[int]) -> None:
        """One message carrying the trajectories ``seqs``. The caller holds the send lock, so
        ``low`` is read in send order: no message for a seq follows one whose ``low`` already
        tells the consumer to forget it."""
        assert self._sock is not None and self._loop is not None
        low = next(iter(self._pending))  # seqs enter in order: the first is the lowest
        encoded = [self._pending[seq].encoded for seq in seqs]
        numbers = [low]
        for seq, one in zip(seqs, encoded, strict=True):
            numbers += (seq, len(one.header), one.size)
        message = [
            PUT,
            struct.pack(f">{len(numbers)}Q", *numbers),
            b"".join(one.header for one in encoded),
            b"".join(part for one in encoded for part in one.parts),  # the one copy of tokens
        ]
        while True:
            try:
                _send_frames(self._sock, message)
                break
            except zmq.Again:  # at the high-water mark: wait for room, loop not blocked
                self._writable = self._loop.create_future()
                self._on_socket()  # room may have come already
                await self._writable
        self.messages += 1
        self._on_socket()  # the send may have taken the FD's edge: look at the socket now

    async def _send_outbox(self) -> None:
        """The sender: everything in the outbox, a message at a time, until it stays empty."""
        assert self._send_lock is not None
        async with self._send_lock:
            for batch in self._batches(self._outbox):
                try:
                    await self._send(batch)
                except zmq.ZMQError as err:  # the socket is gone: these puts cannot complete
                    self._fail(batch, QueueError(f"cannot send to {self.address}: {err}"))
                else:
                    self.sent += len(batch)

    async def put(self, trajectory: Trajectory) -> None:
        """Send ``trajectory`` and wait for its acknowledgement (back-pressure: may wait long)."""
        if self._closed:
            raise QueueError(f"the trajectory sink to {self.address} is closed")
        if not self.send_turns and trajectory.turns:
            trajectory = dataclasses.replace(trajectory, turns=[])
        encoded = codec.encode_parts(trajectory)  # a CodecError reaches the caller first
        self._connect()
        seq = self._next_seq
        self._next_seq += 1
        entry = _Pending(asyncio.get_running_loop().create_future(), encoded)
        self._pending[seq] = entry
        assert self._settled is not None
        self._settled.clear()
        self._outbox.append(seq)
        if self._sender is None or self._sender.done():
            self._sender = self._spawn(self._send_outbox())
        # A cancelled put cancels only this wait: the trajectory stays pending until its ack
        # pops it, and close() waits for that (through ``_settled``, not the futures).
        await entry.future

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        assert self._loop is not None
        task = self._loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _pop(self, seq: int) -> _Pending | None:
        """The pending trajectory ``seq`` leaves (acknowledged or failed); ``None`` if it had."""
        entry = self._pending.pop(seq, None)
        if not self._pending and self._settled is not None:
            self._settled.set()
        return entry

    def _fail(self, seqs: Iterable[int], error: QueueError) -> None:
        for seq in seqs:
            entry = self._pop(seq)
            if entry is not None and not entry.future.done():  # done: its put was cancelled
                entry.future.set_exception(error)

    def _on_socket(self) -> None:
        """Take every reply waiting on the socket, and wake a send waiting for room."""
        sock = self._sock
        while sock is not None and not sock.closed:
            events = _events(sock)
            writable = self._writable
            if events & _POLLOUT and writable is not None and not writable.done():
                writable.set_result(None)
            if not events & _POLLIN:
                return
            self._on_reply(sock.recv_multipart(_NOBLOCK))

    def _on_reply(self, reply: list[bytes]) -> None:
        if reply[0] == ACK and len(reply) == 2:
            for seq in _seqs(reply[1]):
                entry = self._pop(seq)
                if entry is None:  # a resend's second ack
                    continue
                self.acked += 1
                if not entry.future.done():  # done: its put was cancelled
                    entry.future.set_result(None)
        elif reply[0] == NACK and len(reply) == 3:
            seqs = _seqs(reply[2])
            self.rejected += sum(1 for seq in seqs if seq in self._pending)
            reason = reply[1].decode(errors="replace")
            self._fail(seqs, QueueError(f"the consumer rejected it: {reason}"))

    def _on_monitor(self) -> None:
        """A new connection after the first may be a restarted consumer: resend what is unacked."""
        monitor = self._monitor
        while monitor is not None and not monitor.closed and _events(monitor) & _POLLIN:
            event = parse_monitor_message(monitor.recv_multipart(_NOBLOCK))
            if event["event"] != zmq.EVENT_HANDSHAKE_SUCCEEDED:
                continue
            self._handshakes += 1
            if self._handshakes > 1 and self._loop is not None:
                self._spawn(self._resend())

    async def _resend(self) -> None:
        """Everything sent and not acknowledged, again (what is still in the outbox goes out
        with the sender as usual)."""
        assert self._send_lock is not None
        async with self._send_lock:
            waiting = set(self._outbox)
            unacked = deque(seq for seq in sorted(self._pending) if seq not in waiting)
            for batch in self._batches(unacked):
                await self._send(batch)
                self.resent += len(batch)
        log.info("reconnected to %s: resent %d trajectories", self.address, self.resent)

    async def close(self) -> None:
        """Wait up to ``close_timeout`` for every acknowledgement, then close the socket."""
        if self._closed:
            return
        self._closed = True
        if self._sock is None:
            return
        assert self._settled is not None
        try:
            settled = asyncio.ensure_future(self._settled.wait())
            timer = asyncio.ensure_future(self._sleep(self.close_timeout))
            try:
                await asyncio.wait({settled, timer}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                settled.cancel()
                timer.cancel()
            if not self._settled.is_set():
                raise QueueError(
                    f"{len(self._pending)} trajectories sent to {self.address} were not "
                    f"acknowledged within {self.close_timeout:g} s; they may be lost"
                )
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        assert self._sock is not None and self._ctx is not None and self._loop is not None
        self._loop.remove_reader(_fd(self._sock))
        if self._monitor is not None:
            self._loop.remove_reader(_fd(self._monitor))
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        closed = QueueError("the sink closed before an ack came")
        waiting = [e.future for e in self._pending.values()]
        for future in [*waiting, self._writable]:
            if future is not None and not future.done():
                future.set_exception(closed)
                future.exception()  # retrieved: a cancelled put no longer awaits it
        with contextlib.suppress(zmq.ZMQError):
            self._sock.disable_monitor()
        if self._monitor is not None:
            self._monitor.close(linger=0)
        self._sock.close(linger=0)
        self._ctx.term()


class ZmqTrajectorySource:
    """Consumer side, bound by the trainer: holds at most ``queue_max_size`` trajectories.

    A background thread owns the ROUTER socket, decodes and acknowledges; ``get`` (sync) and
    ``aget`` (async) hand trajectories out in arrival order. After ``close``, ``get`` still
    returns what was buffered (so a checkpoint can save it), then ``None``. ``address`` is the
    bound endpoint (``tcp://127.0.0.1:*`` picks a free port). Counters: ``received``,
    ``delivered``, ``buffered``, ``duplicates``, ``rejected``; and for the memory the bound
    holds, ``buffered_bytes`` (the buffered trajectories' size on the wire), ``peak_buffered``
    and ``peak_buffered_bytes``.

    ``on_receipt``, when given, is called with each trajectory just before it enters the buffer
    (on the socket thread, before ``received`` counts it and before its acknowledgement): the run's books settle from it which episodes a
    gateway killed mid-hand-over had delivered (:mod:`areal.core.episode_journal`).

    A put message may carry more trajectories than the buffer has room for: the rest wait in
    the socket thread, undecoded and unacknowledged (so their ``put`` calls keep waiting), and
    enter the buffer as ``get`` makes room. Beyond the bound, the consumer so holds at most one
    message's worth (the producers' ``batch_max``), as ZeroMQ's pipes hold the rest.
    """

    def __init__(
        self,
        address: str,
        *,
        queue_max_size: int = 64,
        ack_linger_ms: int = 500,
        on_receipt: Callable[[Trajectory], None] | None = None,
    ) -> None:
        if queue_max_size < 1:
            raise ValueError(f"queue_max_size must be at least 1, got {queue_max_size}")
        self.queue_max_size = queue_max_size
        self.received = 0
        self.delivered = 0
        self.duplicates = 0
        self.rejected = 0
        self._ack_linger_ms = ack_linger_ms
        self._on_receipt = on_receipt
        self._buffer: deque[Trajectory] = deque()
        self._sizes: deque[int] = deque()  # wire bytes of each buffered trajectory
        self.buffered_bytes = 0
        self.peak_buffered = 0
        self.peak_buffered_bytes = 0
        self._cond = threading.Condition()
        self._stopping = False
        self._error: BaseException | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._ready = threading.Event()
        self._address = ""
        self._thread = threading.Thread(
            target=self._serve, args=(address,), name="areal-trajectory-source", daemon=True
        )
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._close_pipe()
            raise QueueError(f"cannot bind the trajectory queue to {address}: {self._error}")

    @property
    def address(self) -> str:
        return self._address

    @property
    def buffered(self) -> int:
        with self._cond:
            return len(self._buffer)

    @property
    def buffered_tombstones(self) -> int:
        """How many of the buffered trajectories are tombstones (announced discards, no
        episode to train): the accounting must not count them as received episodes."""
        with self._cond:
            return sum(1 for t in self._buffer if t.is_tombstone)

    def counters(self) -> dict[str, int]:
        return {
            "received": self.received,
            "delivered": self.delivered,
            "buffered": self.buffered,
            "duplicates": self.duplicates,
            "rejected": self.rejected,
            "buffered_bytes": self.buffered_bytes,
            "peak_buffered": self.peak_buffered,
            "peak_buffered_bytes": self.peak_buffered_bytes,
        }

    def get(self, timeout: float | None = None) -> Trajectory | None:
        """The next trajectory, or ``None`` after ``timeout`` seconds (or once closed and empty)."""
        with self._cond:
            if not self._buffer:
                self._cond.wait_for(lambda: self._buffer or self._stopping, timeout)
            return self._pop_locked()

    async def aget(self, timeout: float | None = None) -> Trajectory | None:
        """``get`` for an event loop. A buffered trajectory is returned at once; only an empty
        buffer waits, in a worker thread (pass a timeout). The trainer takes a whole batch this
        way, so most takes skip the thread hop."""
        with self._cond:
            if self._buffer:
                return self._pop_locked()
        return await asyncio.to_thread(self.get, timeout)

    def _pop_locked(self) -> Trajectory | None:
        """The first buffered trajectory (the caller holds the lock); ``None`` if there is none,
        ``QueueError`` if the socket thread failed."""
        if not self._buffer:
            if self._error is not None:
                raise QueueError(f"the trajectory queue failed: {self._error}")
            return None
        was_full = len(self._buffer) >= self.queue_max_size
        item = self._buffer.popleft()
        self.buffered_bytes -= self._sizes.popleft()
        self.delivered += 1
        if was_full:
            self._wake()  # there is room again: let the socket thread read (and ack) the next
        return item

    def close(self) -> None:
        """Stop receiving and unbind; what is buffered stays available to ``get``."""
        if self._stopping:
            return
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._wake()
        self._thread.join(timeout=10)
        self._close_pipe()

    def __enter__(self) -> ZmqTrajectorySource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the socket thread -------------------------------------------------------------------

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def _close_pipe(self) -> None:
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _serve(self, address: str) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        try:
            sock.setsockopt(zmq.LINGER, self._ack_linger_ms)  # the last acks still go out
            sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting producer keeps its id
            sock.bind(address)
            self._address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as err:
            self._error = err
            sock.close(linger=0)
            ctx.term()
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop(sock)
        except Exception as err:  # surfaced to get(); the socket thread must not die silently
            log.exception("the trajectory queue at %s failed", self._address)
            with self._cond:
                self._error = err
                self._stopping = True
                self._cond.notify_all()
        finally:
            sock.close()
            ctx.term()

    def _loop(self, sock: zmq.Socket[bytes]) -> None:
        reading, full = zmq.Poller(), zmq.Poller()
        reading.register(sock, zmq.POLLIN)
        for poller in (reading, full):
            poller.register(self._wake_r, zmq.POLLIN)
        seen: dict[bytes, set[int]] = {}  # producer id -> acked sequence numbers >= its low
        acks: dict[bytes, list[bytes]] = {}  # producer id -> seqs taken, not yet acknowledged
        # The trajectories of messages received but not yet taken into the buffer: a message
        # may carry more than there is room for, and those wait here unacknowledged.
        held: deque[_Item] = deque()
        buffer, limit = self._buffer, self.queue_max_size  # len() of a deque needs no lock
        while not self._stopping:
            room = len(buffer) < limit
            if not (room and held):
                events = dict((reading if room else full).poll())
                if self._wake_r in events:
                    os.read(self._wake_r, 4096)
            while room and not self._stopping:
                if not held:
                    if not _events(sock) & _POLLIN:
                        break
                    self._unpack(sock, sock.recv_multipart(copy=False), held)
                    continue
                # What fits, decoded outside the lock, enters the buffer in one hand-off (one
                # wake-up of a waiting ``get``, not one per trajectory), then is acknowledged.
                fits = min(len(held), limit - len(buffer), ACK_BATCH)
                self._deliver([self._take(sock, held.popleft(), seen, acks) for _ in range(fits)])
                self._send_acks(sock, acks)
                room = len(buffer) < limit

    @staticmethod
    def _send_acks(sock: zmq.Socket, acks: dict[bytes, list[bytes]]) -> None:
        for producer, seqs in acks.items():
            _send_frames(sock, [producer, ACK, b"".join(seqs)])
        acks.clear()

    def _reject(self, sock: zmq.Socket, producer: bytes, seqs: list[bytes], reason: str) -> None:
        self.rejected += max(1, len(seqs))
        log.warning("rejected a put: %s", reason)
        # No seq frame when even the envelope is unreadable: there is none to name.
        seq_frame = [b"".join(seqs)] if seqs else []
        _send_frames(sock, [producer, NACK, reason.encode(), *seq_frame])

    def _unpack(self, sock: zmq.Socket, frames: list[zmq.Frame], held: deque[_Item]) -> None:
        """A put message's trajectories, each still as its header and its slice of the payload,
        onto ``held``; a message that is not a put is counted and dropped, one whose envelope
        does not match its frames is answered with a NACK for every sequence number it names."""
        if len(frames) < 3 or frames[1].bytes != PUT:
            self.rejected += 1
            log.warning("dropped a message that is not an %s put", PUT.decode())
            return
        producer, envelope = frames[0].bytes, frames[2].bytes
        if len(envelope) < 8 + _PER_PUT or (len(envelope) - 8) % _PER_PUT:
            reason = (
                "the envelope must be 8-byte numbers, low then (seq, header bytes, payload "
                f"bytes) for 1 trajectory or more: {len(envelope)} bytes"
            )
            self._reject(sock, producer, [], reason)
            return
        count = (len(envelope) - 8) // _PER_PUT
        numbers = struct.unpack(f">{1 + 3 * count}Q", envelope)
        seqs = [envelope[8 + _PER_PUT * i : 16 + _PER_PUT * i] for i in range(count)]
        if len(frames) != 5:
            reason = f"{len(frames) - 3} frames after the envelope, not 2 (headers and payload)"
            self._reject(sock, producer, seqs, reason)
            return
        headers, payload = frames[3].bytes, frames[4].buffer
        header_sizes, payload_sizes = numbers[2::3], numbers[3::3]
        if sum(header_sizes) != len(headers) or sum(payload_sizes) != payload.nbytes:
            reason = (
                f"the envelope's sizes ({sum(header_sizes)} header and {sum(payload_sizes)} "
                f"payload bytes) do not match the frames' ({len(headers)} and {payload.nbytes})"
            )
            self._reject(sock, producer, seqs, reason)
            return
        message = _Message(producer, numbers[0], count)
        at_header = at_payload = 0
        for seq, header_size, payload_size in zip(seqs, header_sizes, payload_sizes, strict=True):
            header = headers[at_header : at_header + header_size]
            part = payload[at_payload : at_payload + payload_size]  # a view: no copy
            held.append(_Item(message, seq, header, part))
            at_header += header_size
            at_payload += payload_size

    def _take(
        self,
        sock: zmq.Socket,
        item: _Item,
        seen: dict[bytes, set[int]],
        acks: dict[bytes, list[bytes]],
    ) -> tuple[Trajectory, int] | None:
        """One trajectory of a put, decoded with its wire size, to be delivered and then
        acknowledged; ``None`` for a duplicate (acknowledged again) or one that does not decode
        (a NACK)."""
        message, seq = item.message, int.from_bytes(item.seq, "big")
        acked = seen.setdefault(message.producer, set())
        message.left -= 1
        taken: tuple[Trajectory, int] | None = None
        if seq in acked:
            self.duplicates += 1
            acks.setdefault(message.producer, []).append(item.seq)
        else:
            try:
                trajectory = codec.decode([item.header, item.payload])
            except Exception as err:  # a decoder's own bug costs this trajectory, not the queue
                reason = str(err)
                if not isinstance(err, CodecError):
                    log.exception("decoding a trajectory failed unexpectedly")
                    reason = f"decoding failed unexpectedly: {err!r}"
                message.failed = True
                self._reject(sock, message.producer, [item.seq], reason)
                return None
            taken = (trajectory, len(item.header) + item.payload.nbytes)
            acked.add(seq)
            acks.setdefault(message.producer, []).append(item.seq)
        # Only a message whose every trajectory decoded may tell the consumer which ids to
        # forget: a malformed one with a high ``low`` would otherwise let a resent trajectory
        # through twice.
        if not message.left and not message.failed:
            acked.difference_update([s for s in acked if s < message.low])
        return taken

    def _deliver(self, taken: list[tuple[Trajectory, int] | None]) -> None:
        """Decoded trajectories into the buffer under one lock, waking the waiting ``get``s."""
        arrived = [t for t in taken if t is not None]
        if not arrived:
            return
        if self._on_receipt is not None:  # first, so no reader counts one it has not seen
            for trajectory, _ in arrived:
                try:
                    self._on_receipt(trajectory)
                except Exception:  # the observer's bug must not end the queue
                    log.exception("on_receipt failed on session %s", trajectory.session_id)
        with self._cond:
            for trajectory, size in arrived:
                self._buffer.append(trajectory)
                self._sizes.append(size)
                self.buffered_bytes += size
            self.peak_buffered = max(self.peak_buffered, len(self._buffer))
            self.peak_buffered_bytes = max(self.peak_buffered_bytes, self.buffered_bytes)
            self.received += len(arrived)
            self._cond.notify(len(arrived))


@dataclass(slots=True)
class _Message:
    """A received put message, as far as its trajectories' handling needs it."""

    producer: bytes
    low: int
    left: int  # its trajectories not yet taken
    failed: bool = False


@dataclass(slots=True)
class _Item:
    """One trajectory of a received put message, not yet decoded."""

    message: _Message
    seq: bytes
    header: bytes
    payload: memoryview


_SINK_OPTIONS = {"address", "close_timeout", "send_turns", "batch_max"}


def zmq_sink(options: dict[str, Any]) -> ZmqTrajectorySink:
    """The registered factory: ``options["address"]`` is the trainer's queue endpoint."""
    address = options.get("address")
    if not address or not isinstance(address, str):
        raise ValueError(
            "the zmq trajectory sink needs options.address "
            "(the trainer's queue endpoint, e.g. tcp://127.0.0.1:5557 or ipc:///tmp/areal.queue)"
        )
    unknown = sorted(set(options) - _SINK_OPTIONS)
    if unknown:
        raise ValueError(f"the zmq trajectory sink has no option(s) {', '.join(unknown)}")
    return ZmqTrajectorySink(
        address,
        close_timeout=float(options.get("close_timeout", 30.0)),
        send_turns=bool(options.get("send_turns", False)),
        batch_max=int(options.get("batch_max", BATCH_MAX)),
    )
