"""How does a warm-started tiny model do on a task set, through the real engine and gateway?

Run: ``.venv/bin/python bench/task_check.py --size tiny`` (``--size nano``, ``--steps 0`` to skip
the warm start, ``--json`` for scripts).

What it does, all on 127.0.0.1 in this process: creates the embedded tiny model of ``--size``
(cached under ``--work``), runs the format warm start on the task set's demonstrations and times
it (cached too: a second run reuses it, ``--fresh`` redoes it), starts the embedded engine and the
gateway (policy route at ``--temperature``, trajectories to a JSONL sink), and plays
``--episodes`` episodes of the task set's agent through rollout workers, on tasks of a seed the
warm start never saw.

It prints the mean reward and each of its parts, the prompt and generated token counts per model
call, and what the gateway made of each episode: model calls, and training samples (1 when the
two turns merged into one sequence, 2 when they did not).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from areal.core.episode import Episode
from areal.core.tasks import TaskStream
from areal.core.types import Trajectory
from areal.gateway.app import build_app
from areal.gateway.router_config import RouterConfig
from areal.gateway.server import build_state
from areal.host.http_server import ServerThread
from areal.plugins.inference.embedded.server import build_server
from areal.plugins.models.tiny import init_tiny
from areal.plugins.tasks import tool_then_answer
from areal.plugins.trainer.warm_start import RECORD_NAME, warm_start
from areal.run.rollout import RolloutWorker

GATEWAY_KEY = "task-check-gateway-key-0123456789"
ADMIN_TOKEN = "task-check-admin-token-0123456789"
POLICY = "areal-tiny"
EVAL_SEED = 1000  # the warm start's demonstrations use seed 0's questions


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    work = Path(args.work)
    base = work / f"{args.size}-base"
    if not (base / "config.json").is_file():
        init_tiny(base, size=args.size, seed=0)
    report: dict[str, Any] = {"size": args.size, "task_set": args.task_set}
    model_dir = base
    if args.steps:
        out = work / f"{args.size}-warm-{args.steps}-{args.batch_size}-{args.lr:g}"
        if args.fresh and (out / RECORD_NAME).is_file():
            (out / RECORD_NAME).unlink()
        began = time.perf_counter()
        model_dir = warm_start(
            base,
            out,
            task_set=args.task_set,
            steps=args.steps,
            batch_size=args.batch_size,
            learning_rate=args.lr,
            num_threads=args.threads,
        )
        record = json.loads((model_dir / RECORD_NAME).read_text())
        report["warm_start"] = {
            "steps": args.steps,
            "batch_size": args.batch_size,
            "learning_rate": args.lr,
            "seconds_training": record["seconds"],
            "seconds_this_call": round(time.perf_counter() - began, 2),
            "loss_first": record["loss_first"],
            "loss_last": record["loss_last"],
        }
    report["episodes"] = asyncio.run(play_episodes(model_dir, args))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)


async def play_episodes(model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    outcomes: list[tool_then_answer.Outcome] = []

    async def recording_agent(episode: Episode) -> float:
        client = episode.openai_client()
        try:
            outcome = await tool_then_answer.play(client, episode.model, episode.task)
        finally:
            await client.close()
        outcomes.append(outcome)
        return outcome.score.total

    server = build_server(str(model_dir), max_total_tokens=65536, seed=args.seed)
    engine = ServerThread(server.app(), "127.0.0.1", 0).start()
    with tempfile.TemporaryDirectory() as logs:
        route = {"model_id": POLICY, "temperature": args.temperature, "max_tokens": 256}
        config = RouterConfig.model_validate({"model_routing": {"policy_model": route}})
        state = build_state(
            config, [engine.url], gateway_key=GATEWAY_KEY, admin_token=ADMIN_TOKEN, log_dir=logs
        )
        gateway = ServerThread(build_app(state), "127.0.0.1", 0).start()
        try:
            stream = TaskStream(path=None, name=args.task_set, seed=EVAL_SEED)
            tasks = [stream[i] for i in range(args.episodes)]
            worker = RolloutWorker(
                gateway.url,
                ADMIN_TOKEN,
                recording_agent,
                concurrency=args.concurrency,
                model=POLICY,
            )
            began = time.perf_counter()
            stats = await worker.run(tasks)
            seconds = time.perf_counter() - began
        finally:
            gateway.stop()
            server.engine.stop()
            engine.stop()
        lines = (Path(logs) / "trajectories.jsonl").read_text().splitlines()
        trajectories = [Trajectory.from_json(json.loads(line)) for line in lines]
    summary = summarize(outcomes, trajectories, stats.to_json(), seconds)
    summary["why_not_merged"] = unmerged_examples(model_dir, trajectories)
    return summary


def unmerged_examples(model_dir: Path, trajectories: list[Trajectory]) -> list[dict[str, str]]:
    """Where turn 2's prompt stops extending turn 1's prompt and output, for a few episodes."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    found = []
    for t in trajectories:
        if len(t.samples) < 2 or len(t.turns) < 2:
            continue
        first, second = sorted(t.turns, key=lambda c: c.turn)[:2]
        generated = first.prompt_ids + first.output_ids
        at = next(
            (i for i, (x, y) in enumerate(zip(generated, second.prompt_ids)) if x != y),
            min(len(generated), len(second.prompt_ids)),
        )
        found.append(
            {
                "generated": str(tokenizer.decode(generated[at - 8 : at + 8])),
                "rendered_again": str(tokenizer.decode(second.prompt_ids[at - 8 : at + 8])),
            }
        )
    return found[:3]


def summarize(
    outcomes: list[tool_then_answer.Outcome],
    trajectories: list[Trajectory],
    stats: dict[str, Any],
    seconds: float,
) -> dict[str, Any]:
    def mean(values: list[float]) -> float | None:
        return round(statistics.fmean(values), 4) if values else None

    parts = ("call", "a", "b", "answer")
    calls = max((len(o.prompt_tokens) for o in outcomes), default=0)
    return {
        "n": len(outcomes),
        "seconds": round(seconds, 2),
        "rollout": stats,
        "reward_mean": mean([o.score.total for o in outcomes]),
        "reward_parts_mean": {p: mean([getattr(o.score, p) for o in outcomes]) for p in parts},
        "reward_histogram": dict(sorted(Counter(o.score.total for o in outcomes).items())),
        # Format, not content: after a tool result, does the answer repeat it (what the
        # demonstrations teach)? Among the episodes that got that far.
        "answer_repeats_tool_result": mean(
            [float(r) for o in outcomes if (r := repeats_result(o.transcript)) is not None]
        ),
        "per_call": [
            {
                "call": i + 1,
                "episodes": sum(len(o.prompt_tokens) > i for o in outcomes),
                "prompt_tokens_mean": mean(
                    [o.prompt_tokens[i] for o in outcomes if len(o.prompt_tokens) > i]
                ),
                "generated_tokens_mean": mean(
                    [o.completion_tokens[i] for o in outcomes if len(o.completion_tokens) > i]
                ),
            }
            for i in range(calls)
        ],
        "model_calls_per_episode": dict(Counter(t.completions for t in trajectories)),
        "samples_per_episode": dict(Counter(len(t.samples) for t in trajectories)),
        "example": outcomes[0].transcript if outcomes else None,
    }


def repeats_result(transcript: list[dict[str, Any]]) -> bool | None:
    results = [m["content"] for m in transcript if m["role"] == "tool"]
    last = transcript[-1]
    if not results or last["role"] != "assistant":
        return None
    return (last.get("content") or "").strip() == results[-1]


def print_report(report: dict[str, Any]) -> None:
    print(f"model {report['size']}, task set {report['task_set']}")
    warm = report.get("warm_start")
    if warm:
        print(
            f"warm start: {warm['steps']} steps x {warm['batch_size']} at lr {warm['learning_rate']}"
            f" in {warm['seconds_training']}s (this call {warm['seconds_this_call']}s), "
            f"loss {warm['loss_first']} -> {warm['loss_last']}"
        )
    ep = report["episodes"]
    print(f"{ep['n']} episodes in {ep['seconds']}s: reward {ep['reward_mean']}")
    print(f"  parts: {ep['reward_parts_mean']}")
    print(f"  histogram: {ep['reward_histogram']}")
    print(f"  answer repeats the tool's result: {ep['answer_repeats_tool_result']}")
    for call in ep["per_call"]:
        print(
            f"  call {call['call']} ({call['episodes']} episodes): prompt "
            f"{call['prompt_tokens_mean']} tokens, generated {call['generated_tokens_mean']}"
        )
    print(f"  model calls per episode: {ep['model_calls_per_episode']}")
    print(f"  training samples per episode: {ep['samples_per_episode']}")
    for example in ep["why_not_merged"]:
        print(f"    not merged: {json.dumps(example)}")
    print(f"  rollout: {ep['rollout']}")
    print(f"  example: {json.dumps(ep['example'])}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="tiny", choices=("nano", "tiny", "small"))
    parser.add_argument("--task-set", default=tool_then_answer.NAME)
    parser.add_argument("--steps", type=int, default=100, help="warm start steps (0: none)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--seed", type=int, default=0, help="the engine's sampling seed")
    parser.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "areal-task-check"))
    parser.add_argument("--fresh", action="store_true", help="redo a cached warm start")
    parser.add_argument("--json", action="store_true")
    return parser.parse_args()


if __name__ == "__main__":
    main()
