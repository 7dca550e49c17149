"""Trainer throughput: areal's packed RL step against the padded loop a user would write.

Run: ``.venv/bin/python bench/train.py [--size small] [--batch 32] [--steps 3] [--threads 2]
[--dp 2] [--json PATH]``.

With ``--dp 2`` both sides run on two gloo ranks: areal's step with FSDP2 (``parallelize`` +
``MeshLayout``, each rank packing its share of every minibatch), the baseline under
``DistributedDataParallel`` (each rank padding half of every minibatch). Both sides train the same checkpoint (``areal model init-tiny``'s ``small``, a Qwen3-shaped
decoder) on the same RL batch, in fp32 on the CPU with the same number of torch threads:

- **areal**: :func:`~areal.plugins.trainer.step.train_step` — GRPO advantages, proximal log-probs
  recomputed before the first update, decoupled PPO loss per valid token, minibatches packed into
  one sequence each (no padding, per-sample causal attention), the LM head only at trained
  positions.
- **baseline**: ``transformers.AutoModelForCausalLM`` on the same directory, each minibatch
  padded to its longest sample with an attention mask, the same no-grad proximal pass and the same
  clipped loss averaged over valid tokens, ``AdamW``: the loop in most RL tutorials.

The batch is long-tailed like agent episodes (``bench/longtail_agent.py``): a 32-token prompt and
an output of 8-24 tokens for 75 % of samples, Pareto-tailed up to 256 for the rest. Reported:
trained (non-padding) tokens per second for each, after one warm-up step, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from areal.core.types import Sample
from areal.plugins.models.hf_io import load_model
from areal.plugins.models.tiny import init_tiny
from areal.plugins.trainer.step import train_step

PROMPT_TOKENS = 32
EPS_CLIP = 0.2


def long_tail_lengths(n: int, rng: random.Random, cap: int = 256) -> list[int]:
    """Output lengths: 75 % uniform in 8-24, 25 % Pareto(1.2)-tailed from 24 up to ``cap``."""
    return [
        rng.randint(8, 24) if rng.random() < 0.75 else min(cap, int(24 * rng.paretovariate(1.2)))
        for _ in range(n)
    ]


def make_batch(n: int, vocab: int, group: int, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    samples = []
    for length in long_tail_lengths(n, rng):
        ids = [rng.randrange(3, vocab) for _ in range(PROMPT_TOKENS + length)]
        mask = [0] * PROMPT_TOKENS + [1] * length
        logprobs = [0.0] * PROMPT_TOKENS + [-rng.uniform(0.5, 3.0) for _ in range(length)]
        samples.append(
            Sample(
                input_ids=ids,
                loss_mask=mask,
                logprobs=logprobs,
                versions=[-1] * PROMPT_TOKENS + [0] * length,
                reward=float(rng.random() < 0.5),
            )
        )
    return samples


def grpo_advantages(samples: Sequence[Sample], group: int) -> list[float]:
    out = []
    for start in range(0, len(samples), group):
        rewards = [s.reward for s in samples[start : start + group]]
        mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
        out += [(r - mean) / (std + 1e-6) for r in rewards]
    return out


def baseline_step(
    model: Any, optimizer: torch.optim.Optimizer, samples: Sequence[Sample], mini: int, group: int
) -> None:
    """The padded loop: pad each minibatch, proximal pass first, clipped loss per valid token."""
    advantages = grpo_advantages(samples, group)
    batches = [list(range(i, min(i + mini, len(samples)))) for i in range(0, len(samples), mini)]

    def padded(index: list[int]) -> tuple[torch.Tensor, ...]:
        width = max(len(samples[i].input_ids) for i in index)
        ids = torch.zeros(len(index), width, dtype=torch.long)
        attention = torch.zeros(len(index), width, dtype=torch.long)
        mask = torch.zeros(len(index), width)
        behaviour = torch.zeros(len(index), width)
        for row, i in enumerate(index):
            s, n = samples[i], len(samples[i].input_ids)
            ids[row, :n] = torch.tensor(s.input_ids)
            attention[row, :n] = 1
            mask[row, :n] = torch.tensor(s.loss_mask, dtype=torch.float)
            behaviour[row, :n] = torch.tensor(s.logprobs)
        adv = torch.tensor([advantages[i] for i in index])[:, None].expand(-1, width - 1)
        return ids, attention, mask[:, 1:], behaviour[:, 1:], adv

    def logprobs(ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
        return torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)

    prepared = [padded(index) for index in batches]
    with torch.no_grad():
        proximal = [logprobs(ids, attention) for ids, attention, *_ in prepared]
    for (ids, attention, mask, behaviour, adv), prox in zip(prepared, proximal, strict=True):
        logp = logprobs(ids, attention)
        ratio = torch.exp(logp - prox)
        clipped = torch.clamp(ratio, 1 - EPS_CLIP, 1 + EPS_CLIP)
        weight = torch.exp(prox - behaviour).clamp(max=5.0)  # the decoupled behaviour weight
        loss = -(torch.minimum(ratio * adv, clipped * adv) * weight * mask).sum() / mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def time_steps(step: Any, steps: int) -> list[float]:
    times = []
    for i in range(steps + 1):  # the first is a warm-up
        started = time.perf_counter()
        step()
        if i:
            times.append(time.perf_counter() - started)
    return times


def dp_worker(rank: int, world: int, port: int, args: argparse.Namespace, out: Path) -> None:
    """One of ``world`` gloo ranks: areal's FSDP2 step, then the padded loop under DDP (each
    rank pads and trains its half of every minibatch); rank 0 writes the timings."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from transformers import AutoModelForCausalLM

    from areal.plugins.trainer.parallel.parallel_dims import ParallelDims
    from areal.plugins.trainer.parallel.parallelize import parallelize
    from areal.plugins.trainer.parallel.pipeline import make_layout

    torch.set_num_threads(max(1, args.threads // world))
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        path = out / args.size
        samples = make_batch(args.batch, read_vocab(path), args.group, seed=0)
        groups = [i // args.group for i in range(len(samples))]
        mesh = ParallelDims(world_size=world, dp=world).build_mesh()
        ours = parallelize(load_model(path).train(), mesh)
        ours_opt = torch.optim.AdamW(ours.parameters(), lr=1e-5)
        layout = make_layout(mesh)

        def ours_step() -> None:
            train_step(
                ours, ours_opt, samples, mini_batch_size=args.mini, group_ids=groups,
                current_version=0, max_grad_norm=1.0, layout=layout,
            )  # fmt: skip

        theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).train()
        ddp = DistributedDataParallel(theirs)
        theirs_opt = torch.optim.AdamW(ddp.parameters(), lr=1e-5)
        mine = [s for i, s in enumerate(samples) if (i // (args.mini // world)) % world == rank]

        def theirs_step() -> None:
            baseline_step(ddp, theirs_opt, mine, args.mini // world, args.group)

        timings = {}
        for name, step in (("baseline", theirs_step), ("areal", ours_step)):
            dist.barrier()
            timings[name] = time_steps(step, args.steps)
        if rank == 0:
            (out / "dp.json").write_text(json.dumps(timings))
    finally:
        dist.destroy_process_group()


def read_vocab(path: Path) -> int:
    return int(json.loads((path / "config.json").read_text())["vocab_size"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", help="init-tiny size (nano, tiny, small)")
    parser.add_argument("--batch", type=int, default=32, help="samples per RL step")
    parser.add_argument("--mini", type=int, default=16, help="samples per minibatch")
    parser.add_argument("--group", type=int, default=4, help="GRPO group size")
    parser.add_argument("--steps", type=int, default=3, help="timed steps (after a warm-up)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--json", type=Path, help="write the results here too")
    parser.add_argument("--dp", type=int, default=1, help="2: both sides on 2 gloo ranks")
    args = parser.parse_args(argv)
    if args.dp > 1:
        return main_dp(args)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / args.size
        init_tiny(path, size=args.size, seed=0)
        ours = load_model(path).train()
        theirs = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).train()
    samples = make_batch(args.batch, ours.config.vocab_size, args.group, seed=0)
    groups = [i // args.group for i in range(len(samples))]
    trained_tokens = sum(s.generated_tokens + PROMPT_TOKENS for s in samples)
    padded_tokens = sum(
        len(chunk) * max(len(s.input_ids) for s in chunk)
        for chunk in (samples[i : i + args.mini] for i in range(0, len(samples), args.mini))
    )
    ours_opt = torch.optim.AdamW(ours.parameters(), lr=1e-5)
    theirs_opt = torch.optim.AdamW(theirs.parameters(), lr=1e-5)

    def ours_step() -> None:
        train_step(
            ours, ours_opt, samples, mini_batch_size=args.mini, group_ids=groups,
            current_version=0, max_grad_norm=1.0,
        )  # fmt: skip

    def theirs_step() -> None:
        baseline_step(theirs, theirs_opt, samples, args.mini, args.group)

    results: dict[str, Any] = {
        "size": args.size,
        "batch": args.batch,
        "mini_batch": args.mini,
        "threads": args.threads,
        "tokens_per_step": trained_tokens,
        "padded_tokens_per_step": padded_tokens,
    }
    for name, step in (("baseline", theirs_step), ("areal", ours_step)):
        times = time_steps(step, args.steps)
        median = statistics.median(times)
        results[name] = {
            "seconds": [round(t, 3) for t in times],
            "tokens_per_s": trained_tokens / median,
        }
        print(f"{name:8s} {trained_tokens / median:9.0f} tokens/s  (median {median:.2f}s/step)")
    ratio = results["areal"]["tokens_per_s"] / results["baseline"]["tokens_per_s"]
    results["ratio"] = ratio
    print(
        f"areal / baseline: {ratio:.2f}x  ({trained_tokens} tokens per step; the padded loop "
        f"computes {padded_tokens} positions, {padded_tokens / trained_tokens:.2f}x)"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def main_dp(args: argparse.Namespace) -> int:
    """``--dp N``: areal's FSDP2 step and the padded loop under DDP, each on N gloo ranks."""
    import torch.multiprocessing as mp

    from areal.host.process import pick_free_port

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        init_tiny(out / args.size, size=args.size, seed=0)
        mp.spawn(dp_worker, args=(args.dp, pick_free_port(), args, out), nprocs=args.dp)
        timings = json.loads((out / "dp.json").read_text())
        samples = make_batch(args.batch, read_vocab(out / args.size), args.group, seed=0)
    tokens = sum(len(s.input_ids) for s in samples)
    rates = {name: tokens / statistics.median(times) for name, times in timings.items()}
    for name, rate in rates.items():
        print(f"{name:8s} {rate:9.0f} tokens/s on {args.dp} ranks")
    print(f"areal / baseline (dp={args.dp}): {rates['areal'] / rates['baseline']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"dp": args.dp, "tokens_per_s": rates}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
