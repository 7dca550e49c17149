"""The trajectory queue against raw ZeroMQ: the same bytes, producer and consumer in two processes.

Run: ``.venv/bin/python bench/trajectory_queue.py [--tokens 1024 8192 32768] [--rounds 5]``.

A producer process (the gateway's side) sends trajectories of one sample of ``tokens`` tokens
to a consumer in this process (the trainer's side), over TCP on loopback:

- **queue**: areal's ZeroMQ queue plugin as the run uses it: ``ZmqTrajectorySink.put`` (the
  codec's encode, a sequence number, waiting for the consumer's acknowledgement) with
  ``--in-flight`` puts at once, as a gateway finishing many episodes does, in a process set up
  as the gateway's (its event loop, ``areal.host.event_loop``: uvloop where installed; glibc
  keeping freed memory, ``areal.host.heap``);
  ``ZmqTrajectorySource`` (decode, digest check, duplicate filter, the bounded buffer, the ack)
  drained by ``get``, in a process that keeps freed memory as the trainer's does (raw's
  consumer is the same process);
- **raw**: pyzmq PUSH -> PULL of the very frames the codec makes, encoded once before timing:
  no encode, no decode, no acks. The floor of what any queue on ZeroMQ can do.

Each round sends ``--megabytes`` (1,000: about a second of 8k trajectories): the steady
rate of both modes. At 100 MB an 8k round timed ~70 ms, mostly the queue's ramp-up (the
producer's first messages, its heap's first pages): the queue measured 0.64, 0.75 and 0.64x of
raw against 0.81, 0.88 and 0.70x at 1,000 MB, alternating, the same code.

Reported per size and mode: trajectories/s and MB/s (medians over alternating rounds), the
queue's share of raw, CPU milliseconds per trajectory on each side (process CPU time over
the timed window, divided by the trajectories in it), and how many trajectories a message
carried on average (the queue sends the puts that wait together; raw sends one per message).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import zmq

from areal.core.types import Sample, Trajectory
from areal.host import event_loop
from areal.host.heap import keep_freed_memory
from areal.plugins.queues import codec
from areal.plugins.queues.zmq_queue import ZmqTrajectorySink, ZmqTrajectorySource

WARMUP = 20  # trajectories received before the clock starts (connections, first allocations)


def trajectory(tokens: int, seed: int = 0) -> Trajectory:
    """One episode of one sample: a prompt of a quarter of the tokens, the rest generated."""
    rng = random.Random(seed)
    prompt = tokens // 4
    sample = Sample(
        input_ids=[rng.randrange(150_000) for _ in range(tokens)],
        loss_mask=[0] * prompt + [1] * (tokens - prompt),
        logprobs=[0.0] * prompt + [-rng.random() * 4 for _ in range(tokens - prompt)],
        versions=[-1] * prompt + [rng.randrange(3, 7) for _ in range(tokens - prompt)],
        reward=1.0,
    )
    return Trajectory(session_id=f"s{seed}", samples=[sample], reward=1.0, completions=1)


def wire_bytes(tokens: int) -> int:
    return sum(len(frame) for frame in codec.encode(trajectory(tokens)))


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- the producer process -------------------------------------------------------------------


async def produce_queue(
    address: str, episodes: list[Trajectory], count: int, in_flight: int
) -> int:
    """Put ``count`` episodes from ``in_flight`` sessions; the number of messages they took."""
    sink = ZmqTrajectorySink(address)

    async def episodes_of(worker: int) -> None:  # one of ``in_flight`` sessions finishing
        for i in range(worker, count, in_flight):
            await sink.put(episodes[i % len(episodes)])

    await asyncio.gather(*(episodes_of(w) for w in range(in_flight)))
    await sink.close()
    return sink.messages


def produce_raw(address: str, frames: list[bytes], count: int) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, -1)  # every message out before close returns
    sock.connect(address)
    for _ in range(count):
        sock.send_multipart(frames, copy=False)
    sock.close()
    ctx.term()


def producer_main(mode: str, address: str, tokens: int, count: int, in_flight: int) -> None:
    keep_freed_memory()  # as the gateway's process does (areal.gateway.server)
    episodes = [trajectory(tokens, seed) for seed in range(8)]  # built, as a gateway has them
    frames = codec.encode(episodes[0])
    started, cpu = time.perf_counter(), cpu_seconds()
    if mode == "queue":
        messages = event_loop.run(produce_queue(address, episodes, count, in_flight))
    else:
        produce_raw(address, frames, count)
        messages = count
    wall, used = time.perf_counter() - started, cpu_seconds() - cpu
    print(json.dumps({"wall": wall, "cpu": used, "messages": messages}))


def spawn_producer(mode: str, address: str, tokens: int, count: int, in_flight: int) -> Any:
    args = [mode, address, str(tokens), str(count), str(in_flight)]
    command = [sys.executable, str(Path(__file__).resolve()), "--produce", *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


# --- the consumer (this process) ------------------------------------------------------------


def consume(mode: str, tokens: int, count: int, in_flight: int) -> dict[str, float]:
    """One round: trajectories/s over the window after the warm-up, and each side's CPU."""
    timed = count - WARMUP
    if mode == "queue":
        source = ZmqTrajectorySource("tcp://127.0.0.1:*", queue_max_size=256)
        producer = spawn_producer(mode, source.address, tokens, count, in_flight)
        for _ in range(WARMUP):
            assert source.get(timeout=60) is not None
        started, cpu = time.perf_counter(), cpu_seconds()
        for _ in range(timed):
            assert source.get(timeout=60) is not None
        wall, used = time.perf_counter() - started, cpu_seconds() - cpu
        source.close()
    else:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PULL)
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        producer = spawn_producer(mode, f"tcp://127.0.0.1:{port}", tokens, count, in_flight)
        for _ in range(WARMUP):
            sock.recv_multipart()
        started, cpu = time.perf_counter(), cpu_seconds()
        for _ in range(timed):
            sock.recv_multipart()
        wall, used = time.perf_counter() - started, cpu_seconds() - cpu
        sock.close()
        ctx.term()
    out, _ = producer.communicate(timeout=120)
    assert producer.returncode == 0, f"the {mode} producer failed"
    sent = json.loads(out.strip().splitlines()[-1])
    return {
        "per_s": timed / wall,
        "consumer_cpu_ms": 1000 * used / timed,
        "producer_cpu_ms": 1000 * sent["cpu"] / count,  # all it sent, warm-up included
        "per_message": count / sent["messages"],
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--produce"]:
        mode, address, *numbers = argv[1:6]
        producer_main(mode, address, *(int(n) for n in numbers))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 8192, 32768])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--megabytes", type=float, default=1000.0, help="sent per round and size")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    keep_freed_memory()  # as the trainer's process does (areal.plugins.trainer.engine)
    results: list[dict[str, Any]] = []
    print(f"{'tokens':>7} {'KB':>7} {'mode':>6} {'traj/s':>9} {'MB/s':>8} "
          f"{'producer ms':>12} {'consumer ms':>12} {'per msg':>8} {'queue/raw':>10}")  # fmt: skip
    for tokens in args.tokens:
        size = wire_bytes(tokens)
        count = max(WARMUP + 50, int(args.megabytes * 1e6 / size))
        rounds: dict[str, list[dict[str, float]]] = {"raw": [], "queue": []}
        for _ in range(args.rounds):  # alternating: the machine's drift hits both
            for mode in rounds:
                rounds[mode].append(consume(mode, tokens, count, args.in_flight))
        row: dict[str, Any] = {"tokens": tokens, "bytes": size, "count": count}
        for mode, runs in rounds.items():
            row[mode] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        row["ratio"] = row["queue"]["per_s"] / row["raw"]["per_s"]
        results.append(row)
        for mode in rounds:
            m = row[mode]
            ratio = f"{row['ratio']:.2f}x" if mode == "queue" else ""
            print(f"{tokens:>7} {size / 1e3:>7.1f} {mode:>6} {m['per_s']:>9.0f} "
                  f"{m['per_s'] * size / 1e6:>8.0f} {m['producer_cpu_ms']:>12.3f} "
                  f"{m['consumer_cpu_ms']:>12.3f} {m['per_message']:>8.1f} {ratio:>10}")  # fmt: skip
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
