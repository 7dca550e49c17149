"""One rollout worker process of a training run: ``python -m areal.run.rollout_worker SPEC``.

The run supervisor starts ``async.rollout_workers`` of these. Worker ``w`` of ``n`` takes the
run's task stream at indices ``w, w + n, w + 2n, ...`` (skipping the ones a resumed run already
trained), and runs :class:`~areal.run.rollout.RolloutWorker` on them with ``group_size`` samples
per task, until it is stopped. The admin token comes from ``AREAL_ADMIN_TOKEN`` (never from the
spec file, which holds no secret).

Restarts: before taking task ``i`` the worker records ``i`` in its progress file (atomically), so
a restarted worker goes on after the last task it took instead of replaying its share of the
stream from the start. Episodes in flight when a worker dies are lost (the supervisor discards
their sessions); their tasks are not run again.

Every ``report_interval`` seconds the worker prints one JSON line of its counters to stdout (the
supervisor sends it to the worker's log).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from areal.core.agent_choice import agent_fn_of, choose_adapter, is_harness
from areal.core.episode import session_fields
from areal.core.rewards import build_reward
from areal.core.tasks import TaskStream, configured, load_object, task_set
from areal.host import event_loop
from areal.run.rollout import RolloutError, RolloutStats, RolloutWorker

log = logging.getLogger("areal.rollout")


@dataclass
class WorkerSpec:
    """Everything one worker needs, written by the supervisor as JSON (no secrets)."""

    gateway_url: str
    agent: str | None  # "module:attr"; None: the task set's own agent
    dataset: dict[str, Any]  # the run config's dataset section (path or name, options...)
    worker: int
    workers: int
    group_size: int
    concurrency: int
    episode_timeout_s: float
    max_turns: int
    model: str
    progress_path: str
    reward: str | None = None  # reward plugin for agents that return their answer as text
    reward_options: dict[str, Any] = field(default_factory=dict)  # e.g. the judge's model id
    start: int = 0  # the first task index a fresh worker considers
    skip: list[list[int]] = field(default_factory=list)  # [start, end) ranges already trained
    report_interval: float = 10.0
    framework: str | None = None  # agent.framework: the adapter that wraps the agent
    gateway_log: str | None = None  # named in the message when the gateway cannot be reached

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> WorkerSpec:
        return cls(**json.loads(Path(path).read_text()))


def task_indices(spec: WorkerSpec) -> Iterator[int]:
    """This worker's share of the stream, from where it (or the resumed run) left off."""
    start = spec.start
    progress = Path(spec.progress_path)
    if progress.is_file():
        start = max(start, int(json.loads(progress.read_text())["taken"]) + 1)
    first = start + (spec.worker - start) % spec.workers
    skip = [(a, b) for a, b in spec.skip]
    index = first
    while True:
        if not any(a <= index < b for a, b in skip):
            yield index
        index += spec.workers


def _record(progress: Path, index: int) -> None:
    tmp = progress.with_suffix(".tmp")
    tmp.write_text(json.dumps({"taken": index}))
    os.replace(tmp, progress)


FRAMEWORK_KEY = "agent.framework"  # named in the errors of a wrong framework


def resolve_agent(spec: WorkerSpec, pm: Any = None) -> Any:
    """The :data:`~areal.run.rollout.AgentFn`: the spec's entrypoint (else the harness
    ``agent.framework`` names, else the built-in task set's own agent), with the adapter
    :func:`~areal.core.agent_choice.choose_adapter` picks for it, as ``areal.wrap`` does.

    A plain ``agent(episode)`` and an ``areal.wrap(...)`` result run unchanged. Whether the
    framework is a harness (the agent itself, run without an entrypoint) its adapter declares.
    """
    framework = spec.framework
    if not spec.agent and framework and is_harness(framework, pm, key=FRAMEWORK_KEY):
        agent: Any = framework
    else:
        agent = load_object(spec.agent) if spec.agent else _task_set_agent(spec)
    chosen = choose_adapter(agent, framework=framework, pm=pm, key=FRAMEWORK_KEY)
    return agent_fn_of(chosen)


def _task_set_agent(spec: WorkerSpec) -> Any:
    name = spec.dataset.get("name")
    if not name:
        raise ValueError(
            "agent.entrypoint: a run on a tasks file needs its agent as module:attr "
            "(agent.entrypoint or --agent-config)"
        )
    return load_object(configured(task_set(name), spec.dataset.get("options")).agent)


async def run_worker(spec: WorkerSpec, admin_token: str) -> RolloutStats:
    """Run episodes until cancelled (or until the session API fails: :class:`RolloutError`)."""
    stream = TaskStream(
        path=spec.dataset.get("path"),
        name=spec.dataset.get("name"),
        shuffle=bool(spec.dataset.get("shuffle", True)),
        seed=int(spec.dataset.get("seed", 0)),
        options=spec.dataset.get("options") or None,
        columns=spec.dataset.get("columns") or None,
    )
    reward_fn = None
    if spec.reward:
        options = {"gateway_url": spec.gateway_url, **spec.reward_options}
        reward_fn = build_reward(spec.reward, options)
    agent = resolve_agent(spec)
    worker = RolloutWorker(
        spec.gateway_url,
        admin_token,
        agent,
        reward_fn=reward_fn,
        concurrency=spec.concurrency,
        episode_timeout_s=spec.episode_timeout_s,
        max_turns=spec.max_turns,
        model=spec.model,
        metadata={"worker": str(spec.worker)},
        session_fields=session_fields(agent),
        gateway_log=spec.gateway_log,
    )
    progress = Path(spec.progress_path)

    def tasks() -> Iterator[dict[str, Any]]:
        for index in task_indices(spec):
            _record(progress, index)
            yield stream[index]

    reporter = asyncio.create_task(_report(worker, spec.report_interval))
    try:
        return await worker.run(tasks(), n_samples_per_task=spec.group_size)
    finally:
        reporter.cancel()


async def _report(worker: RolloutWorker, interval: float) -> None:
    started = time.monotonic()
    while True:
        await asyncio.sleep(interval)
        stats = worker.last_stats
        if stats is not None:
            line = {"uptime_s": round(time.monotonic() - started, 1), **stats.to_json()}
            print(json.dumps(line), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m areal.run.rollout_worker")
    parser.add_argument("spec", help="the worker's JSON spec, written by the run supervisor")
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in (
        "httpx",
        "httpx2",
        "openai",
        "LiteLLM",
    ):  # one line per request: the gateway logs those
        logging.getLogger(noisy).setLevel(logging.WARNING)
    admin = os.environ.get("AREAL_ADMIN_TOKEN")
    if not admin:
        print("error: AREAL_ADMIN_TOKEN is not set", file=sys.stderr)
        return 2
    spec = WorkerSpec.load(args.spec)
    try:
        event_loop.run(run_worker(spec, admin))
    except (RolloutError, event_loop.EventLoopChoiceError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
