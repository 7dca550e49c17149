"""Which default group teaches an online conversation best? ``--online-grouping`` on simulated
traffic, through the real grouping rule, the real trainer buffer and the real GRPO.

Run: ``.venv/bin/python bench/online_grouping.py [--conversations 4000] [--seeds 5] [--json F]``.

The traffic: conversations start as a Poisson process (one every ``--every`` seconds); each
asks a prompt, either one of ``--popular`` popular prompts (Zipf weights, exponent 1.2) with
probability ``repeat``, or one nobody else asks. A prompt has a difficulty ``p ~ Beta(2, 2)``;
the conversation is rated 1 (thumbs up) with probability ``p``, else 0, and reaches the trainer
after its talk and its rating (exponential, means 60 s and 120 s). Two mixes: ``product``
(``repeat`` 0.2: most users ask their own thing) and ``faq`` (0.9: most ask a few questions).

Each rule's groups go where the run's go: :class:`areal.gateway.online_groups.DefaultGroups`
names a conversation's group as the gateway hands it over (on the simulation's clock), the
trainer loop's own buffer (:class:`areal.run.loop.TrainerLoop`, ``add`` and ``_take_batch``)
forms batches of ``--batch`` trajectories of whole groups, and GRPO's advantages are
:func:`areal.plugins.losses.advantages.grpo_advantages` on each batch's group ids. Compared:

- ``none``: each conversation alone (what ``--online`` did before): GRPO gives it 0;
- ``prompt``: conversations with the same first user message share a group;
- ``pool``: conversations handed over one after another share a group (at most
  ``--group-size``, within ``--window`` seconds);
- ``baseline``, a reference, not a rule: ``r - b`` with ``b`` the mean earlier reward of the
  same prompt (of all prompts, for a prompt not seen before): a running baseline per prompt,
  which the group-relative losses cannot take.

Reported per rule: the share of conversations with a non-zero advantage, and the **signal**:
the cosine between the advantages and the ideal ones, ``r - p`` (a baseline that knows each
prompt's difficulty). 1 is every conversation pushed by exactly how much better than expected
it went; 0 is no signal (all zero, or noise).
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from areal.core.types import Sample, Trajectory
from areal.gateway.online_groups import DefaultGroups
from areal.plugins.losses.advantages import grpo_advantages
from areal.run.loop import TrainerLoop

MIXES = {"product": 0.2, "faq": 0.9}
RULES = ("none", "prompt", "pool")


@dataclass
class Conversation:
    prompt: str
    p: float  # the prompt's difficulty: the chance it is rated 1
    reward: float
    handed_over: float  # seconds


class SimClock:
    """The simulation's time, which the grouping rule reads."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def traffic(
    rng: np.random.Generator, n: int, repeat: float, popular: int, every: float
) -> list[Conversation]:
    zipf = 1.0 / np.arange(1, popular + 1) ** 1.2
    zipf /= zipf.sum()
    difficulty = rng.beta(2, 2, size=popular)
    start = np.cumsum(rng.exponential(every, size=n))
    out = []
    for i in range(n):
        if rng.random() < repeat:
            k = int(rng.choice(popular, p=zipf))
            prompt, p = f"popular-{k}", float(difficulty[k])
        else:
            prompt, p = f"own-{i}", float(rng.beta(2, 2))
        reward = float(rng.random() < p)
        done = start[i] + rng.exponential(60.0) + rng.exponential(120.0)
        out.append(Conversation(prompt, p, reward, float(done)))
    out.sort(key=lambda c: c.handed_over)
    return out


def grouped_advantages(
    convs: list[Conversation], rule: str, args: argparse.Namespace
) -> np.ndarray:
    """GRPO's advantage of each conversation (in hand-over order) under ``rule``."""
    clock = SimClock()
    groups = DefaultGroups(rule, window=args.window, size=args.group_size, clock=clock)
    loop = TrainerLoop(
        engine=None,  # type: ignore[arg-type]  # no step runs: only the buffer is used
        source=None,  # type: ignore[arg-type]
        sync=None,  # type: ignore[arg-type]
        trigger_batch_size=args.batch,
        staleness_threshold=10**6,
    )
    advantages = np.zeros(len(convs))
    for i, conv in enumerate(convs):
        clock.now = conv.handed_over
        key = groups.assign(conv.prompt)
        meta: dict[str, Any] = {"index": i} | ({"group": key} if key else {})
        sample = Sample([1, 2], [0, 1], [0.0, -1.0], [-1, 0], reward=conv.reward)
        loop.add(Trajectory(f"s{i}", [sample], reward=conv.reward, completions=1, metadata=meta))
        batch = loop._take_batch(now=0.0)
        if batch is None:
            continue
        indices = [e.metadata["index"] for group in batch for e in group]
        gids = [g for g, group in enumerate(batch) for _ in group]
        rewards = torch.tensor([convs[j].reward for j in indices], dtype=torch.float64)
        adv = grpo_advantages(rewards, torch.tensor(gids))
        advantages[indices] = adv.numpy()
    loop.trainer_thread.close()
    return advantages


def running_baseline(convs: list[Conversation]) -> np.ndarray:
    seen: dict[str, list[float]] = {}
    everyone: list[float] = []
    out = np.zeros(len(convs))
    for i, conv in enumerate(convs):
        past = seen.get(conv.prompt) or everyone
        out[i] = conv.reward - (statistics.fmean(past) if past else 0.5)
        seen.setdefault(conv.prompt, []).append(conv.reward)
        everyone.append(conv.reward)
    return out


def score(advantages: np.ndarray, convs: list[Conversation]) -> dict[str, float]:
    ideal = np.array([c.reward - c.p for c in convs])
    norm = float(np.linalg.norm(advantages) * np.linalg.norm(ideal))
    return {
        "nonzero": float(np.mean(np.abs(advantages) > 1e-9)),
        "signal": float(advantages @ ideal / norm) if norm else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=4000)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--every", type=float, default=2.0, help="seconds between starts (mean)")
    parser.add_argument("--popular", type=int, default=40)
    parser.add_argument("--batch", type=int, default=16, help="async.trigger_batch_size")
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--window", type=float, default=300.0)
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    results: dict[str, dict[str, dict[str, float]]] = {}
    for mix, repeat in MIXES.items():
        runs: dict[str, list[dict[str, float]]] = {r: [] for r in (*RULES, "baseline")}
        for seed in range(args.seeds):
            rng = np.random.default_rng(seed)
            convs = traffic(rng, args.conversations, repeat, args.popular, args.every)
            for rule in RULES:
                runs[rule].append(score(grouped_advantages(convs, rule, args), convs))
            runs["baseline"].append(score(running_baseline(convs), convs))
        results[mix] = {
            rule: {k: round(statistics.fmean(r[k] for r in rs), 3) for k in ("nonzero", "signal")}
            for rule, rs in runs.items()
        }
        for rule, figures in results[mix].items():
            print(
                f"{mix:8s} {rule:9s} non-zero advantage {figures['nonzero']:6.1%}   "
                f"signal {figures['signal']:.3f}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
