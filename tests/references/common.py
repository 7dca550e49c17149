"""What the reference test modules share: the reference venv's interpreter, the type of the
``run_reference`` fixture (``conftest.py``), verl's actor config and the random float64 inputs.

Imported as ``references.common`` (``tests`` is on the path).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

RUNNER = Path(__file__).parent / "runner.py"

Calls = list[dict[str, Any]]
RunReference = Callable[[Calls], list[dict[str, Any]]]


def refs_python() -> Path:
    """The reference venv's interpreter (``$AREAL_REFS_PYTHON`` overrides); fails, never skips."""
    override = os.environ.get("AREAL_REFS_PYTHON")
    python = Path(override) if override else Path(sys.prefix) / "refs" / "bin" / "python"
    if not python.exists():
        pytest.fail(
            f"no reference venv at {python}: `make setup` builds it (.venv/refs, AReaL 1.0.4 and "
            "verl 0.9.1 beside CPU torch); AREAL_REFS_PYTHON names another interpreter",
            pytrace=False,
        )
    return python


VERL_ALGOS = "verl.trainer.ppo.core_algos"
VERL_ACTOR = "verl.workers.config:ActorConfig"
VERL_POLICY_LOSS = "verl.workers.config:PolicyLossConfig"


def actor_config(
    policy_loss: dict[str, Any] | None = None, clip: float = 0.2, **fields: Any
) -> dict[str, Any]:
    """verl's own ``ActorConfig`` (built in the reference venv), as its trainer passes it.

    ``clip_ratio_low`` and ``clip_ratio_high`` default to 0.2 each there, whatever
    ``clip_ratio`` says, so ``clip`` sets all three unless a field says otherwise."""
    fields = {"clip_ratio": clip, "clip_ratio_low": clip, "clip_ratio_high": clip, **fields}
    kwargs: dict[str, Any] = {
        "strategy": "fsdp",
        "ppo_micro_batch_size_per_gpu": 1,
        "rollout_n": 1,
        **fields,
    }
    if policy_loss is not None:
        kwargs["policy_loss"] = {"__build__": VERL_POLICY_LOSS, "kwargs": policy_loss}
    return {"__build__": VERL_ACTOR, "kwargs": kwargs}


LENGTHS = (5, 3, 6, 4, 2)  # five sequences; the last has no valid token at all


def random_inputs(seed: int, *, padded: bool = False) -> dict[str, torch.Tensor]:
    """Loss inputs, float64: π_θ, π_prox within ~0.15 of it, π_behav within ~0.5 of π_prox (so
    caps and KL bounds have tokens on both sides), per-token advantages, and each sequence's
    constant advantage (GRPO's shape). The first token of every sequence and one more are masked
    and hold garbage. Packed ``[N]`` with ``cu_seqlens`` (AReaL's trainer layout), or ``[B, T]``
    rows (verl's; padding masked)."""
    g = torch.Generator().manual_seed(seed)
    n = sum(LENGTHS)
    logp = -torch.rand(n, generator=g, dtype=torch.float64) * 3.0 - 0.05
    prox = logp + 0.15 * torch.randn(n, generator=g, dtype=torch.float64)
    behav = prox + 0.5 * torch.randn(n, generator=g, dtype=torch.float64)
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()])
    seq_adv = torch.repeat_interleave(torch.randn(len(LENGTHS), generator=g, dtype=torch.float64),
                                      torch.tensor(LENGTHS))  # fmt: skip
    mask = torch.ones(n, dtype=torch.bool)
    mask[cu[:-1]] = False
    mask[int(cu[2]) + 2] = False
    mask[int(cu[-2]) :] = False
    out = {"logprobs": logp, "proximal_logprobs": prox, "behavior_logprobs": behav,
           "advantages": adv, "sequence_advantages": seq_adv, "loss_mask": mask,
           "cu_seqlens": cu}  # fmt: skip
    if not padded:
        return out
    width = max(LENGTHS)
    rows: dict[str, torch.Tensor] = {}
    for name, value in out.items():
        if name == "cu_seqlens":
            continue
        fill = False if value.dtype == torch.bool else 0.0
        grid = torch.full((len(LENGTHS), width), fill, dtype=value.dtype)
        for i in range(len(LENGTHS)):
            a, b = int(cu[i]), int(cu[i + 1])
            grid[i, : b - a] = value[a:b]
        rows[name] = grid
    return rows
