"""The workload of ``bench/async_vs_sync.py``: episodes whose output lengths are long-tailed.

An episode is one chat call through the gateway with ``max_tokens=L`` and ``ignore_eos``, so the
engine generates exactly ``L`` tokens whatever the (random) model says. ``L`` is fixed per task and
sample in the tasks file (:func:`write_tasks`), so a sync and an async run see the same workload.

The length distribution (:func:`draw_length`), a mixture that mimics RL rollouts where most
answers are short and a few run long:

- 75 %: uniform on [8, 24] tokens (mean 16);
- 25 %: a Pareto tail, ``L = 24 · U^(-1/α)`` with α = 1.2, capped at 256 tokens.

The agent shares one ``openai.AsyncOpenAI`` per process and gives each call its episode's session
key as the ``Authorization`` header: a new client per episode (``Episode.openai_client()``) builds
a TLS context, ~20 ms of CPU, which at 20 episodes/s is 40 % of the core the rollout worker shares
with the trainer; and a ``with_options`` copy per episode looks its platform up again in a worker
thread on its first request (openai 3.60), a thread hop per episode. A synthetic workload should
cost the system, not the agent.

The reward is a deterministic function of the generated text (a hash mapped to [0, 1]): it varies
between the samples of a task, so GRPO advantages (and gradients) are not zero, but it rewards
nothing in particular. This measures the system, not learning.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

from areal.core.episode import Episode

SHORT = (8, 24)  # the body: uniform on [8, 24]
TAIL_SHARE = 0.25  # the share of episodes in the tail
TAIL_ALPHA = 1.2  # the tail's Pareto index (heavier below 2: a few are very long)
TAIL_CAP = 256  # the longest episode, in tokens

# 14 tokens with the chat template: short, so a trained sequence is mostly generated tokens and
# the small model trains about as fast as it generates (the overlap is what is measured).
PROMPT = "Write {length} tokens."


def draw_length(rng: random.Random) -> int:
    """One output length, from the mixture of the module docstring."""
    if rng.random() >= TAIL_SHARE:
        return rng.randint(*SHORT)
    u = 1.0 - rng.random()  # (0, 1]
    return min(TAIL_CAP, round(SHORT[1] * u ** (-1.0 / TAIL_ALPHA)))


def write_tasks(path: Path, n_tasks: int, group_size: int, seed: int = 0) -> list[int]:
    """A JSONL tasks file; task ``i`` holds one length per sample. Returns every length drawn."""
    rng = random.Random(f"longtail:{seed}")
    drawn: list[int] = []
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n_tasks):
            lengths = [draw_length(rng) for _ in range(group_size)]
            drawn.extend(lengths)
            f.write(json.dumps({"task_id": f"lt-{i}", "lengths": lengths}) + "\n")
    return drawn


def reward(text: str) -> float:
    """A deterministic value in [0, 1] from the generated text."""
    digest = hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


_clients: dict[str, Any] = {}  # base URL -> the process's openai.AsyncOpenAI


def _client(episode: Episode) -> Any:
    """The process's client for the gateway (no retries: a retry would be recorded as a second
    turn); each call names its episode's key itself."""
    client = _clients.get(episode.base_url)
    if client is None:
        client = _clients[episode.base_url] = episode.openai_client(max_retries=0)
    return client


async def agent(episode: Episode) -> float:
    """One chat call of exactly the task's length for this sample; its reward."""
    lengths: list[int] = episode.task["lengths"]
    length = lengths[episode.sample % len(lengths)]
    prompt = PROMPT.format(length=length)
    response: Any = await _client(episode).chat.completions.create(
        model=episode.model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=length,
        extra_body={"ignore_eos": True},
        extra_headers={"Authorization": f"Bearer {episode.api_key}"},
    )
    return reward(response.choices[0].message.content or "")
