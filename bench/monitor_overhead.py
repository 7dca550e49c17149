"""Does the live monitor slow training? The same trainer run with and without it, alternating.

Run: ``.venv/bin/python bench/monitor_overhead.py [--steps 8] [--rounds 3] [--json PATH]``.

The workload is the quickstart's trainer side: areal's ``tiny`` model, GRPO steps of 128 samples
(16 tasks x 8, 40 prompt + 16 generated tokens, mini-batches of 64), driven by the real
:class:`~areal.run.loop.TrainerLoop` through the runner's own per-trajectory hook
(``_Run.observe``: the ``rollout`` events, the staleness histogram, tokens per worker) from an
in-memory queue, with a weight sync that does nothing. Leaving out generation and the weight sync
makes a step shorter than in a real run, so the overhead measured here is an upper bound.

Arms, each round running them in turn (a different order each round):

- ``off``: metric sinks ``train_log`` + ``jsonl`` (the events sink disabled);
- ``process``: + the ``events`` sink, and ``areal monitor``'s loop in another process subscribed
  to it, drawing at up to 4 Hz to a terminal-like sink (``/dev/null``);
- ``thread``: + the ``events`` sink, and the monitor drawn by a thread of the training process,
  as ``areal train`` does on a terminal.

Each arm reports, per step and as the median over its rounds, wall seconds and the CPU seconds of
the training process (``time.process_time``: all its threads, the publisher's and, in ``thread``,
the monitor's included), plus the monitor process's own CPU seconds. On a shared machine the wall
time moves with other people's load by far more than 1 %; the trainer's CPU time is the steadier
measure of what the monitor costs it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ARMS = ("off", "process", "thread")


def build_trajectories(steps: int, version: int) -> list[Any]:
    from areal.core.types import Sample, Trajectory

    out = []
    for step in range(steps):
        for task in range(16):
            for k in range(8):
                prompt = [(7 * task + i) % 200 + 10 for i in range(40)]
                output = [(3 * k + 5 * i + step) % 200 + 10 for i in range(16)]
                sample = Sample(
                    input_ids=prompt + output,
                    loss_mask=[0] * 40 + [1] * 16,
                    logprobs=[0.0] * 40 + [-2.0] * 16,
                    versions=[-1] * 40 + [version] * 16,
                )
                out.append(
                    Trajectory(
                        f"s{step}-{task}-{k}-{time.monotonic_ns()}",
                        [sample],
                        float((task + k) % 2),
                        1,
                        metadata={"task_id": f"{step}-{task}", "worker": str(k % 2)},
                    )
                )
    return out


class MemorySource:
    """The trajectory queue, in memory: what the run's ZeroMQ source returns."""

    def __init__(self, items: list[Any]) -> None:
        self.items = list(items)
        self.buffered = 0

    async def aget(self, timeout: float | None = None) -> Any:
        return self.items.pop(0) if self.items else None


class NoSync:
    engine_urls: list[str] = []
    last_phases: dict[str, float] = {}

    async def publish(self, model: Any, version: int) -> float:
        return 0.0

    async def catch_up(self, url: str, version: int) -> None:
        return None

    async def close(self) -> None:
        return None


def run_arm(
    arm: str, model: Any, optimizer: Any, config: Any, steps: int, work: Path
) -> tuple[float, float, float]:
    """Wall seconds, trainer-process CPU seconds and monitor CPU seconds per step of one round."""
    from areal.core.metrics import MetricsHub, make_metric_sink
    from areal.plugins.trainer.engine import Policy
    from areal.run.loop import TrainerLoop
    from areal.run.observe import ObservedSource
    from areal.run.runner import _Run

    log_dir = work / f"logs-{arm}"
    log_dir.mkdir(parents=True, exist_ok=True)
    names = ["train_log", "jsonl"] + ([] if arm == "off" else ["events"])
    hub = MetricsHub({n: make_metric_sink(n, {"log_dir": str(log_dir)}) for n in names})
    run = _Run(config, work / "out", False)
    run.hub = hub
    hub.write("run", 0, run.run_values())
    monitor: subprocess.Popen[bytes] | None = None
    stop = threading.Event()
    watcher: threading.Thread | None = None
    draws: list[int] = []
    if arm != "off":
        address = json.loads((log_dir / "events.json").read_text())["address"]
        if arm == "process":
            cmd = [sys.executable, __file__, "--monitor", address]
            monitor = subprocess.Popen(cmd, stdout=subprocess.PIPE)
        else:
            watcher = threading.Thread(target=watch, args=(address, stop, draws), daemon=True)
            watcher.start()
        time.sleep(1.0)  # connected and idle before the clock starts

    source = MemorySource(build_trajectories(steps, version=0))
    loop = TrainerLoop(
        Policy.of(model, optimizer, mini_batch_size=64),
        ObservedSource(source, run.observe, 256),  # type: ignore[arg-type]
        NoSync(),
        trigger_batch_size=128,
        staleness_threshold=100,
        metrics=hub,
        poll_timeout=0.01,
    )

    async def on_step(result: dict[str, float]) -> None:
        hub.write("sync", int(result["step"]), {"version": loop.version, "seconds": 0.0})

    started, cpu_started = time.perf_counter(), time.process_time()
    asyncio.run(loop.run(steps, on_step=on_step))
    seconds = (time.perf_counter() - started) / steps
    cpu = (time.process_time() - cpu_started) / steps
    hub.write("end", steps, {"stopped_by": "max_steps", "version": loop.version, "error": ""})
    hub.close()
    monitor_cpu = 0.0
    if monitor is not None:
        out, _ = monitor.communicate(timeout=30)
        frames, used = out.decode().split()
        draws.append(int(frames))
        monitor_cpu = float(used) / steps
    if watcher is not None:
        watcher.join(timeout=10)
        stop.set()
    extra = f", monitor drew {draws[-1]} frames" if draws else ""
    if monitor is not None:
        extra += f" using {monitor_cpu:.4f} CPU s/step in its process"
    print(f"  {arm}: {seconds:.3f} s/step, trainer process {cpu:.3f} CPU s/step{extra}")
    return seconds, cpu, monitor_cpu


def watch(address: str, stop: threading.Event, draws: list[int]) -> None:
    """``areal monitor ADDRESS`` drawing to a terminal that is /dev/null; counts its frames."""
    from rich.console import Console

    from areal.cli.monitor import live
    from areal.cli.monitor.source import Subscriber

    drawn = [0]
    render = live.render

    def counting(*args: Any, **kwargs: Any) -> Any:
        drawn[0] += 1
        return render(*args, **kwargs)

    live.render = counting  # type: ignore[assignment]
    with open(os.devnull, "w") as null:
        console = Console(file=null, force_terminal=True, width=120)
        subscriber = Subscriber(address)
        try:
            live.follow(subscriber, console, stop=stop)
        finally:
            subscriber.close()
    draws.append(drawn[0])


def unit_costs(work: Path) -> dict[str, float]:
    """The monitor's costs one at a time, in CPU seconds, free of other people's load: an event
    through the publisher (the trainer's append plus the publisher thread's encode and send to a
    subscriber), the runner's per-trajectory bookkeeping, and one frame of the monitor."""
    import zmq
    from rich.console import Console

    from areal.cli.monitor.render import render
    from areal.cli.monitor.source import read_records
    from areal.cli.monitor.state import MonitorState
    from areal.plugins.metrics.events_pub import EventPublisher
    from areal.run.observe import ArrivalWindow

    pub = EventPublisher(None)
    sub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.connect(pub.address)
    time.sleep(0.5)
    n = 5000
    values = {"loss": 0.1, "reward": 0.5, "version": 3, "updated": 128, "grad_norm": 1.0}
    values |= {f"counter_{i}": i for i in range(15)}  # a train event has about 20 values
    cpu = time.process_time()
    for step in range(n):
        pub.write("train", step, values)
    while pub.sent < n:
        time.sleep(0.01)
    per_event = (time.process_time() - cpu) / n
    pub.close()
    sub.close(0)

    trajectories = build_trajectories(4, version=0)
    window = ArrivalWindow()
    cpu = time.process_time()
    for t in trajectories:
        window.add(t, 1)
        sum(s.generated_tokens for s in t.samples)  # tokens of the trajectory
    per_trajectory = (time.process_time() - cpu) / len(trajectories)

    state = MonitorState()
    state.feed_all(
        read_records(Path(__file__).parents[1] / "tests/cli/snapshots/quickstart_events.jsonl")
    )
    with open(os.devnull, "w") as null:
        console = Console(file=null, force_terminal=True, width=120)
        for _ in range(5):
            console.print(render(state))
        cpu = time.process_time()
        for _ in range(100):
            console.print(render(state))
        per_frame = (time.process_time() - cpu) / 100
    return {"event_s": per_event, "trajectory_s": per_trajectory, "frame_s": per_frame}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=8, help="steps per arm per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the trainer")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    parser.add_argument("--monitor", help=argparse.SUPPRESS)  # the monitor process's side
    args = parser.parse_args()
    if args.monitor:
        draws: list[int] = []
        own_cpu = time.process_time()
        watch(args.monitor, threading.Event(), draws)
        print(draws[0], time.process_time() - own_cpu)
        return

    import torch

    from areal.core.run_config import run_config_from_dict
    from areal.plugins.models.hf_io import load_model
    from areal.plugins.models.tiny import init_tiny

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        init_tiny(work / "model", size="tiny")
        model = load_model(work / "model", dtype=torch.float32).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
        config = run_config_from_dict(
            {
                "model": {"path": str(work / "model")},
                "dataset": {"name": "calculator"},
                "train": {"max_steps": args.steps, "global_batch_size": 128},
                "async": {"trigger_batch_size": 128, "queue_max_size": 256},
                "logging": {"log_dir": str(work / "logs")},
            }
        )
        run_arm("off", model, optimizer, config, 2, work)  # warm-up, not counted
        rounds: dict[str, list[tuple[float, float, float]]] = {arm: [] for arm in ARMS}
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}")
            order = ARMS[r % 3 :] + ARMS[: r % 3]
            for arm in order:
                rounds[arm].append(run_arm(arm, model, optimizer, config, args.steps, work))
        costs = unit_costs(work)
    wall = {arm: statistics.median(r[0] for r in rs) for arm, rs in rounds.items()}
    cpu = {arm: statistics.median(r[1] for r in rs) for arm, rs in rounds.items()}
    monitor_cpu = statistics.median(r[2] for r in rounds["process"])
    report = {
        "steps_per_round": args.steps,
        "rounds": args.rounds,
        "wall_s_per_step": wall,
        "trainer_cpu_s_per_step": cpu,
        "monitor_process_cpu_s_per_step": monitor_cpu,
        "wall_ratio": {arm: wall[arm] / wall["off"] for arm in ARMS},
        "cpu_ratio": {arm: cpu[arm] / cpu["off"] for arm in ARMS},
        "unit_costs_cpu_s": costs,
        "all": rounds,
    }
    for arm in ARMS[1:]:
        print(
            f"{arm}: wall {wall[arm]:.3f} vs {wall['off']:.3f} s/step "
            f"({report['wall_ratio'][arm]:.4f}x); trainer CPU {cpu[arm]:.4f} vs "
            f"{cpu['off']:.4f} s/step ({report['cpu_ratio'][arm]:.4f}x)"
        )
    print(f"the monitor process: {monitor_cpu:.4f} CPU s per training step")
    events, frames = 4, 2  # per step: train, sync, accounting, rollout; a redraw per burst
    trainer = events * costs["event_s"] + 128 * costs["trajectory_s"]
    print(
        f"unit costs (CPU): {1e6 * costs['event_s']:.1f} us per event, "
        f"{1e6 * costs['trajectory_s']:.1f} us per trajectory, "
        f"{1e3 * costs['frame_s']:.2f} ms per frame"
    )
    print(
        f"per step of {cpu['off']:.3f} CPU s: training process {1e3 * trainer:.2f} ms "
        f"({100 * trainer / cpu['off']:.3f} %), + {frames} frames drawn in it "
        f"{100 * (trainer + frames * costs['frame_s']) / cpu['off']:.2f} %"
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
