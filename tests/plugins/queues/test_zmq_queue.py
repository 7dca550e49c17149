"""The ZeroMQ trajectory queue on real sockets: threads, a second process, back-pressure, acks."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import zmq

from areal.core.queue import make_sink, make_source
from areal.core.types import Completion, Sample, Trajectory
from areal.plugins.queues import codec
from areal.plugins.queues.zmq_queue import (
    NACK,
    PUT,
    QueueError,
    ZmqTrajectorySink,
    ZmqTrajectorySource,
)
from support import eventually_async
from support.clock import FakeSleeps

LOOPBACK = "tcp://127.0.0.1:*"
WAIT_S = 30.0  # the ceiling for a message to cross a local socket


async def until_sent(sink: ZmqTrajectorySink, count: int) -> None:
    """Until ``count`` puts have left the producer: what is not acknowledged by then is held."""
    await eventually_async(lambda: sink.sent >= count, WAIT_S, f"{count} puts sent")


# A producer in another process: reads trajectories (JSON) and puts them, then closes at once.
PRODUCER = """
import asyncio, json, sys
from areal.core.queue import make_sink
from areal.core.types import Trajectory

async def main(address, path):
    sink = make_sink("zmq", {"address": address, "close_timeout": 20})
    for line in open(path, encoding="utf-8"):
        await sink.put(Trajectory.from_json(json.loads(line)))
    await sink.close()  # right after the last put: the PUSH-before-close trap
    print(json.dumps(sink.counters()))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def trajectory(i: int, producer: str = "p", with_turns: bool = False) -> Trajectory:
    """A trajectory as the trainer receives it (no raw turns unless ``with_turns``)."""
    n = 3 + i % 4
    samples = [
        Sample(list(range(i, i + n)), [0] + [1] * (n - 1), [0.0] + [-0.25 * k for k in range(1, n)],
               [-1] + [i] * (n - 1), reward=i / 8, completion_ids=[f"{producer}{i}"]),
        Sample([], [], [], [], reward=0.0),  # an empty sample travels too
    ]  # fmt: skip
    turn = Completion(f"{producer}{i}", f"{producer}-{i}", 0, "policy", [i], [i + 1], [-0.5],
                      [i], "stop", reward=1.0, created=float(i))  # fmt: skip
    meta = {"task": f"задача {i} ✓", "producer": producer}
    turns = [turn] if with_turns else []
    return Trajectory(f"{producer}-{i}", samples, i / 8, 1, meta, created=100.0 + i, turns=turns)


def start_producer_process(address: str, sent: list[Trajectory], tmp: Path) -> subprocess.Popen:
    path = tmp / f"to-send-{len(sent)}-{sent[0].session_id}.jsonl"
    path.write_text("".join(json.dumps(t.to_json()) + "\n" for t in sent), encoding="utf-8")
    return subprocess.Popen(
        [sys.executable, "-c", PRODUCER, address, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def drain(source: ZmqTrajectorySource, count: int, timeout: float = 10.0) -> list[Trajectory]:
    got: list[Trajectory] = []
    while len(got) < count:
        item = source.get(timeout=timeout)
        assert item is not None, f"only {len(got)} of {count} trajectories arrived"
        got.append(item)
    return got


def test_a_producer_process_that_closes_right_after_its_last_put_loses_nothing(
    tmp_path: Path,
) -> None:
    sent = [trajectory(i) for i in range(40)]
    with ZmqTrajectorySource(LOOPBACK, queue_max_size=4) as source:
        proc = start_producer_process(source.address, sent, tmp_path)
        got = drain(source, len(sent))
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        assert source.get(timeout=0.2) is None
    assert got == sent  # exact, in order, unicode metadata and empty samples included
    counters = json.loads(out)  # sequential puts: one message each
    assert counters == {
        "sent": 40, "acked": 40, "pending": 0, "resent": 0, "rejected": 0, "messages": 40
    }  # fmt: skip
    counters = source.counters()
    assert counters | {"peak_buffered": 0, "peak_buffered_bytes": 0} == {
        "received": 40, "delivered": 40, "buffered": 0, "duplicates": 0, "rejected": 0,
        "buffered_bytes": 0, "peak_buffered": 0, "peak_buffered_bytes": 0,
    }  # fmt: skip
    assert 1 <= counters["peak_buffered"] <= 40  # how many the trainer let pile up: timing


@pytest.mark.parametrize("send_turns", [False, True])
def test_raw_turns_travel_only_when_asked(send_turns: bool) -> None:
    """The trainer reads samples; the turns (a second copy of every token) stay behind."""
    sent = trajectory(3, with_turns=True)
    with ZmqTrajectorySource(LOOPBACK) as source:

        async def produce() -> None:
            sink = ZmqTrajectorySink(source.address, close_timeout=5, send_turns=send_turns)
            await asyncio.wait_for(sink.put(sent), 5)
            await sink.close()

        asyncio.run(produce())
        (got,) = drain(source, 1)
    assert got.turns == (sent.turns if send_turns else [])
    assert got.samples == sent.samples and got.metadata == sent.metadata


def test_a_full_queue_makes_put_wait_until_the_consumer_reads() -> None:
    with ZmqTrajectorySource(LOOPBACK, queue_max_size=2) as source:

        async def produce() -> None:
            sink = ZmqTrajectorySink(source.address, close_timeout=5)
            await asyncio.wait_for(sink.put(trajectory(0)), 5)
            await asyncio.wait_for(sink.put(trajectory(1)), 5)
            third = asyncio.create_task(sink.put(trajectory(2)))
            await until_sent(sink, 3)
            assert not third.done(), "the third put returned while the consumer held its bound"
            assert sink.counters()["pending"] == 1 and source.buffered == 2
            assert source.received == 2

            first = await source.aget(timeout=1)  # room for one more: the third goes through
            assert first == trajectory(0)
            await asyncio.wait_for(third, 5)
            assert source.buffered == 2
            await sink.close()
            assert sink.counters() == {
                "sent": 3, "acked": 3, "pending": 0, "resent": 0, "rejected": 0, "messages": 3
            }  # fmt: skip

        asyncio.run(produce())
        assert drain(source, 2) == [trajectory(1), trajectory(2)]


def test_a_send_at_the_high_water_mark_waits_for_room_without_blocking_the_loop() -> None:
    """The consumer is not there yet: ZeroMQ's pipe takes ``send_hwm`` messages (of
    ``batch_max`` puts each), the next send is refused (EAGAIN) and waits on the socket's
    edge-triggered FD. Once the consumer binds the pipe drains and every put completes;
    meanwhile the event loop kept running (the sender yields only where it waits for room, so
    the loop running the check below while puts are pending proves both)."""
    with zmq.Context() as ctx, ctx.socket(zmq.REP) as probe:
        port = probe.bind_to_random_port("tcp://127.0.0.1")
    address = f"tcp://127.0.0.1:{port}"
    trajectories = [trajectory(i) for i in range(12)]

    async def scenario() -> ZmqTrajectorySource:
        sink = ZmqTrajectorySink(address, send_hwm=2, batch_max=2)
        puts = [asyncio.create_task(sink.put(t)) for t in trajectories]
        await until_sent(sink, 2)
        assert sink.sent < len(trajectories) and not any(p.done() for p in puts)
        source = ZmqTrajectorySource(address, queue_max_size=64)
        await asyncio.wait_for(asyncio.gather(*puts), timeout=30)
        await sink.close()
        assert sink.counters()["acked"] == len(trajectories)
        return source

    source = asyncio.run(scenario())
    with source:
        assert [source.get(timeout=5) for _ in trajectories] == trajectories


def test_many_puts_in_flight_never_lose_an_acknowledgement() -> None:
    """ZeroMQ's FD is edge-triggered and a send may consume the edge that announced an ack: a
    sink that looked at its socket only when the loop saw the FD readable stalled here within
    a few hundred puts (checked by removing the look after each send)."""
    count, in_flight = 3000, 16
    with ZmqTrajectorySource(LOOPBACK, queue_max_size=256) as source:
        taken: list[Trajectory] = []
        reader = threading.Thread(target=lambda: taken.extend(source.get(10) for _ in range(count)))
        reader.start()

        async def produce() -> None:
            sink = ZmqTrajectorySink(source.address)

            async def session(first: int) -> None:
                for i in range(first, count, in_flight):
                    await sink.put(trajectory(i % 50))

            await asyncio.wait_for(asyncio.gather(*(session(w) for w in range(in_flight))), 60)
            await sink.close()
            assert sink.counters()["acked"] == count

        asyncio.run(produce())
        reader.join(30)
    assert len(taken) == count and all(t is not None for t in taken)


def test_puts_made_together_travel_together_in_order_and_once() -> None:
    """40 puts made in one event-loop turn leave as ``40 / batch_max`` messages; the consumer
    unpacks them into the trajectories, in put order, each once."""
    sent = [trajectory(i) for i in range(40)]
    with ZmqTrajectorySource(LOOPBACK, queue_max_size=64) as source:

        async def produce() -> dict[str, int]:
            sink = ZmqTrajectorySink(source.address, close_timeout=5, batch_max=8)
            await asyncio.wait_for(asyncio.gather(*(sink.put(t) for t in sent)), 10)
            await sink.close()
            return sink.counters()

        counters = asyncio.run(produce())
        assert counters == {
            "sent": 40, "acked": 40, "pending": 0, "resent": 0, "rejected": 0, "messages": 5
        }  # fmt: skip
        assert drain(source, 40) == sent
        assert source.get(timeout=0.2) is None and source.duplicates == 0


def test_a_message_bigger_than_the_room_left_waits_unacknowledged() -> None:
    """One message of 6 trajectories reaches a consumer with room for 2: it buffers 2 and
    acknowledges those; the other 4 puts keep waiting (back-pressure holds per trajectory, not
    per message) and complete, in order, as ``get`` makes room."""
    sent = [trajectory(i) for i in range(6)]
    with ZmqTrajectorySource(LOOPBACK, queue_max_size=2) as source:

        async def produce() -> None:
            sink = ZmqTrajectorySink(source.address, close_timeout=5)
            puts = [asyncio.create_task(sink.put(t)) for t in sent]
            await asyncio.wait_for(asyncio.gather(*puts[:2]), 5)  # one message: all six sent
            assert [p.done() for p in puts] == [True, True, False, False, False, False]
            assert sink.messages == 1 and source.buffered == 2
            got = [await source.aget(timeout=1) for _ in range(3)]
            await asyncio.wait_for(asyncio.gather(*puts[:5]), 5)
            assert not puts[5].done() and source.buffered == 2
            got += [await source.aget(timeout=1) for _ in range(3)]
            await asyncio.wait_for(puts[5], 5)
            assert got == sent
            await sink.close()

        asyncio.run(produce())
        assert source.counters()["peak_buffered"] == 2


def test_the_consumer_counts_the_bytes_its_bound_holds() -> None:
    """``buffered_bytes`` is the wire size of what is buffered; the peaks stay at the most the
    bound let in (``bench/memory.py`` reports them against ``queue_max_size``)."""
    sent = [trajectory(i) for i in range(3)]
    sizes = [sum(len(f) for f in codec.encode(t)) for t in sent]
    with ZmqTrajectorySource(LOOPBACK, queue_max_size=2) as source:

        async def produce() -> None:
            sink = ZmqTrajectorySink(source.address, close_timeout=5)
            for t in sent[:2]:
                await asyncio.wait_for(sink.put(t), 5)
            third = asyncio.create_task(sink.put(sent[2]))
            await until_sent(sink, 3)
            assert source.counters()["buffered_bytes"] == sizes[0] + sizes[1]
            assert await source.aget(timeout=1) == sent[0]
            await asyncio.wait_for(third, 5)
            await sink.close()

        asyncio.run(produce())
        counters = source.counters()
        assert counters["buffered_bytes"] == sizes[1] + sizes[2]
        assert counters["peak_buffered"] == 2
        assert counters["peak_buffered_bytes"] == max(sizes[0] + sizes[1], sizes[1] + sizes[2])
        drain(source, 2)
        assert source.counters()["buffered_bytes"] == 0


def test_two_producers_one_consumer_each_trajectory_exactly_once(tmp_path: Path) -> None:
    remote = [trajectory(i, "remote") for i in range(25)]
    local = [trajectory(i, "local") for i in range(25)]
    with ZmqTrajectorySource(LOOPBACK, queue_max_size=3) as source:
        proc = start_producer_process(source.address, remote, tmp_path)

        async def produce() -> None:  # concurrent puts from one sink, as the gateway does
            sink = make_sink("zmq", {"address": source.address})
            await asyncio.gather(*(sink.put(t) for t in local))
            await sink.close()

        thread = threading.Thread(target=asyncio.run, args=(produce(),))
        thread.start()
        got = drain(source, 50)
        thread.join(timeout=10)
        assert proc.wait(timeout=20) == 0, proc.communicate()[1]
        assert source.get(timeout=0.2) is None
    by_id = {t.session_id: t for t in got}
    assert len(by_id) == 50
    assert by_id == {t.session_id: t for t in remote + local}
    remote_order = [t.session_id for t in got if t.session_id.startswith("remote")]
    assert remote_order == [t.session_id for t in remote]  # one producer's order is kept
    assert source.duplicates == 0


def test_a_restarted_consumer_gets_what_the_crashed_one_never_acknowledged(
    tmp_path: Path,
) -> None:
    address = f"ipc://{tmp_path}/queue"

    async def scenario() -> None:
        first = ZmqTrajectorySource(address, queue_max_size=1)
        sink = ZmqTrajectorySink(address, close_timeout=5)
        await asyncio.wait_for(sink.put(trajectory(0)), 5)
        pending = asyncio.create_task(sink.put(trajectory(1)))  # waits: the consumer is full
        await until_sent(sink, 2)
        assert not pending.done()
        first.close()  # the consumer goes away without acknowledging trajectory 1
        assert first.get(timeout=0) == trajectory(0) and first.get(timeout=0) is None

        with ZmqTrajectorySource(address, queue_max_size=1) as second:
            await asyncio.wait_for(pending, 5)  # resent on reconnect, acknowledged by the new one
            assert await second.aget(timeout=1) == trajectory(1)
            assert sink.resent >= 1
            await sink.close()

    asyncio.run(scenario())


def test_a_restarted_consumer_gets_the_part_of_a_message_the_crashed_one_held(
    tmp_path: Path,
) -> None:
    """One message of 4 reaches a consumer with room for 1: it buffers and acknowledges the
    first and holds the other 3 unacknowledged. It goes away; a new consumer at the same address
    gets exactly those 3, in order, from the producer's resend."""
    address = f"ipc://{tmp_path}/queue"
    sent = [trajectory(i) for i in range(4)]

    async def scenario() -> None:
        first = ZmqTrajectorySource(address, queue_max_size=1)
        sink = ZmqTrajectorySink(address, close_timeout=5)
        puts = [asyncio.create_task(sink.put(t)) for t in sent]
        await asyncio.wait_for(puts[0], 5)  # one message: all four sent
        assert sink.messages == 1 and not any(p.done() for p in puts[1:])
        first.close()
        assert first.get(timeout=0) == sent[0] and first.get(timeout=0) is None

        with ZmqTrajectorySource(address, queue_max_size=8) as second:
            await asyncio.wait_for(asyncio.gather(*puts[1:]), 5)
            assert [await second.aget(timeout=1) for _ in range(3)] == sent[1:]
            assert second.get(timeout=0.2) is None and second.duplicates == 0
            assert sink.resent == 3
            await sink.close()

    asyncio.run(scenario())


def test_close_reports_trajectories_that_were_never_acknowledged() -> None:
    """``close`` waits ``close_timeout`` for acknowledgements, not less (on a fake clock), then
    names how many never came; the puts waiting for them fail, and the sink takes no more."""
    with zmq.Context() as ctx, ctx.socket(zmq.ROUTER) as silent:  # accepts, never acks
        port = silent.bind_to_random_port("tcp://127.0.0.1")

        async def scenario() -> None:
            sleeps = FakeSleeps()
            sink = ZmqTrajectorySink(
                f"tcp://127.0.0.1:{port}", close_timeout=20, sleep=sleeps.sleep
            )
            put = asyncio.create_task(sink.put(trajectory(0)))
            await until_sent(sink, 1)
            closing = asyncio.create_task(sink.close())
            await eventually_async(lambda: sleeps.sleeping, WAIT_S, "close waiting for acks")
            sleeps.advance(19.5)
            assert sleeps.sleeping == 1 and not closing.done(), "close gave up early"
            sleeps.advance(0.5)
            with pytest.raises(QueueError, match=r"1 trajectories .* not acknowledged within 20 s"):
                await closing
            with pytest.raises(QueueError, match="closed before an ack"):
                await put
            with pytest.raises(QueueError, match="is closed"):
                await sink.put(trajectory(1))

        asyncio.run(scenario())


def test_the_consumer_rejects_a_corrupted_trajectory_and_keeps_serving() -> None:
    frames = [bytes(frame) for frame in codec.encode(trajectory(3))]
    frames[1] = frames[1][:-1] + bytes([frames[1][-1] ^ 0xFF])
    with ZmqTrajectorySource(LOOPBACK) as source, zmq.Context() as ctx:
        with ctx.socket(zmq.DEALER) as raw:
            raw.connect(source.address)
            # low 7; seq 7 with its header's and payload's sizes; the headers; the payloads
            sizes = [7, 7, len(frames[0]), len(frames[1])]
            envelope = b"".join(n.to_bytes(8, "big") for n in sizes)
            raw.send_multipart([PUT, envelope, *frames])
            assert raw.poll(5000)
            kind, reason, seq = raw.recv_multipart()
        assert (kind, int.from_bytes(seq, "big")) == (NACK, 7)
        assert b"the payload is corrupted (XXH3-64 mismatch)" in reason
        assert source.rejected == 1 and source.buffered == 0

        async def good() -> None:
            sink = ZmqTrajectorySink(source.address)
            await sink.put(trajectory(4))
            await sink.close()

        asyncio.run(good())
        assert source.get(timeout=1) == trajectory(4)


def test_a_decoder_that_fails_unexpectedly_costs_one_trajectory_not_the_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An exception that is not a ``CodecError`` (a bug in the decoder) must not end the socket
    thread, and with it the queue: that trajectory is refused and logged, its neighbours in the
    same message are delivered, and the queue keeps serving."""
    real_decode = codec.decode

    def buggy_decode(frames: Any) -> Trajectory:
        got = real_decode(frames)
        if got.session_id == "p-1":
            raise RuntimeError("a bug in the decoder")
        return got

    monkeypatch.setattr(codec, "decode", buggy_decode)
    with ZmqTrajectorySource(LOOPBACK) as source:

        async def scenario() -> list[BaseException | None]:
            sink = ZmqTrajectorySink(source.address)
            puts = [sink.put(trajectory(i)) for i in range(3)]  # one message of three
            outcomes = await asyncio.gather(*puts, return_exceptions=True)
            await sink.put(trajectory(3))  # the queue still serves
            await sink.close()
            return outcomes

        outcomes = asyncio.run(scenario())
        assert outcomes[0] is None and outcomes[2] is None
        assert isinstance(outcomes[1], QueueError)
        assert "RuntimeError('a bug in the decoder')" in str(outcomes[1])
        assert drain(source, 3) == [trajectory(0), trajectory(2), trajectory(3)]
        assert source.rejected == 1


def test_on_receipt_sees_each_trajectory_before_its_put_returns_and_cannot_end_the_queue() -> None:
    """The run's books rely on the order: a put that returned was seen by ``on_receipt`` (the
    gateway notes its hand-over after the put). An observer that raises costs nothing."""
    seen: list[str] = []

    def on_receipt(arrived: Trajectory) -> None:
        seen.append(arrived.session_id)
        if arrived.session_id == "p-1":
            raise RuntimeError("a bug in the observer")

    source = make_source("zmq", {"address": LOOPBACK, "on_receipt": on_receipt})
    with source:

        async def scenario() -> None:
            sink = ZmqTrajectorySink(source.address)
            for i in range(3):
                await sink.put(trajectory(i))
                assert seen[-1] == f"p-{i}"
            await sink.close()

        asyncio.run(scenario())
        assert seen == ["p-0", "p-1", "p-2"]
        assert drain(source, 3) == [trajectory(0), trajectory(1), trajectory(2)]


def test_the_registered_factory_checks_its_options() -> None:
    with pytest.raises(ValueError, match=r"needs options\.address"):
        make_sink("zmq", {})
    with pytest.raises(ValueError, match=r"no option\(s\) port"):
        make_sink("zmq", {"address": "tcp://127.0.0.1:1", "port": 1})
    with pytest.raises(ValueError, match="batch_max must be at least 1"):
        make_sink("zmq", {"address": "tcp://127.0.0.1:1", "batch_max": 0})
    assert make_sink("zmq", {"address": "tcp://127.0.0.1:1", "batch_max": 4}).batch_max == 4  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="queue_max_size must be at least 1"):
        ZmqTrajectorySource(LOOPBACK, queue_max_size=0)
    with pytest.raises(QueueError, match="cannot bind"):
        ZmqTrajectorySource("tcp://not-an-address")


def test_a_cancelled_put_still_arrives_and_close_waits_for_its_ack() -> None:
    """Cancelling a put cancels only the caller's wait: the trajectory stays pending, reaches
    the consumer once there is room, and ``close`` waits for its acknowledgement."""
    with ZmqTrajectorySource(LOOPBACK, queue_max_size=1) as source:

        async def produce() -> None:
            sleeps = FakeSleeps()  # close's timeout never runs out: it waits for the ack
            sink = ZmqTrajectorySink(source.address, close_timeout=5, sleep=sleeps.sleep)
            await asyncio.wait_for(sink.put(trajectory(0)), 5)
            second = asyncio.create_task(sink.put(trajectory(1)))
            await until_sent(sink, 2)
            assert not second.done() and sink.pending == 1  # the consumer is full
            second.cancel()
            with pytest.raises(asyncio.CancelledError):
                await second
            assert sink.pending == 1
            closing = asyncio.create_task(sink.close())
            await eventually_async(lambda: sleeps.sleeping, WAIT_S, "close waiting for the ack")
            assert await asyncio.to_thread(source.get) == trajectory(0)  # room, during close
            await closing
            assert sink.counters()["acked"] == 2 and sink.pending == 0

        asyncio.run(produce())
        assert drain(source, 1) == [trajectory(1)]


class _CountingExecutor(ThreadPoolExecutor):
    """The loop's default executor, counting the calls sent to its threads."""

    calls = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        type(self).calls += 1
        return super().submit(fn, *args, **kwargs)


def test_aget_takes_buffered_trajectories_without_a_worker_thread() -> None:
    """The trainer takes a batch with ``aget``: what is buffered comes back at once, and only an
    empty buffer waits in a worker thread (and still gets what arrives while it waits)."""
    sent = [trajectory(i) for i in range(20)]
    with ZmqTrajectorySource(LOOPBACK, queue_max_size=64) as source:

        async def scenario() -> None:
            asyncio.get_running_loop().set_default_executor(_CountingExecutor(max_workers=1))
            sink = ZmqTrajectorySink(source.address, close_timeout=5)
            await asyncio.wait_for(asyncio.gather(*(sink.put(t) for t in sent)), 5)
            assert [await source.aget(timeout=1) for _ in sent] == sent
            assert _CountingExecutor.calls == 0
            late = asyncio.create_task(source.aget(timeout=WAIT_S))  # empty: waits in a thread
            await eventually_async(lambda: _CountingExecutor.calls, WAIT_S, "aget in a thread")
            await asyncio.wait_for(sink.put(trajectory(99)), 5)
            assert await late == trajectory(99)
            assert _CountingExecutor.calls == 1
            assert await source.aget(timeout=0.1) is None
            await sink.close()

        asyncio.run(scenario())
