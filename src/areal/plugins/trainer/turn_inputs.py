"""The per-turn inputs an advantage estimator may ask for, in the step's ``[N, T]`` layout.

Every estimator gets ``rewards`` ``[N]``, ``group_ids`` ``[N]`` and the prediction-aligned
``loss_mask`` ``[N, T]`` (column t is token t+1). One that credits turns names some of
:data:`~areal.core.loss_options.TURN_INPUTS` in its signature and gets them in the same layout:

- ``token_returns`` ``[N, T]``: the return of the turn each generated token belongs to (its
  sample's :class:`~areal.core.types.TurnSpan`), 0 elsewhere;
- ``turn_ids`` ``[N, T]``: that turn's index in its episode, -1 elsewhere;
- ``episode_ids`` ``[N]``: which episode each sample belongs to;
- ``input_ids`` ``[N, T]``: the tokens (for estimators that key turns by what they answered).

Only what the estimator names is built: GRPO's default path costs nothing more. Episodes need no
id on the wire: the run hands an episode's samples over together and in turn order, and turn
spans count across the episode, so a sample whose first turn is not turn 0 continues the
episode before it (:func:`episode_ids`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from areal.core.loss_options import TURN_INPUTS
from areal.core.types import Sample

__all__ = ["episode_ids", "turn_inputs", "wanted_turn_inputs"]


def wanted_turn_inputs(estimator: Callable[..., Any]) -> tuple[str, ...]:
    """The :data:`TURN_INPUTS` ``estimator`` names in its signature."""
    params = inspect.signature(estimator).parameters
    return tuple(name for name in TURN_INPUTS if name in params)


def episode_ids(samples: Sequence[Sample], group_ids: Sequence[int]) -> list[int]:
    """Episode index per sample: a sample continues the previous one's episode when it is of the
    same group and its first turn is not the episode's first (turn 0)."""
    out: list[int] = []
    for i, sample in enumerate(samples):
        continues = (
            i > 0
            and group_ids[i] == group_ids[i - 1]
            and bool(sample.turns)
            and sample.turns[0].turn > 0
        )
        out.append(out[-1] if continues else (out[-1] + 1 if out else 0))
    return out


def _aligned(columns: Sequence[np.ndarray], width: int, fill: float, dtype: torch.dtype) -> Tensor:
    """Per-sample token columns shifted to the prediction-aligned layout (t holds token t+1)."""
    out = torch.full((len(columns), width), fill, dtype=dtype)
    for i, column in enumerate(columns):
        if len(column) > 1:
            out[i, : len(column) - 1] = torch.from_numpy(np.ascontiguousarray(column[1:]))
    return out


def turn_inputs(
    samples: Sequence[Sample],
    group_ids: Sequence[int],
    wanted: Sequence[str],
    *,
    width: int,
    return_shift: Tensor | None = None,
) -> dict[str, Tensor]:
    """The inputs of ``wanted`` for ``samples``. ``return_shift`` ``[N]`` is added to every
    generated token's return (the KL-to-reference penalty, which lowers the sample's reward)."""
    out: dict[str, Tensor] = {}
    if "token_returns" in wanted:
        returns = _aligned([s.token_returns() for s in samples], width, 0.0, torch.float32)
        if return_shift is not None:
            mask = _aligned([s.loss_mask for s in samples], width, 0, torch.uint8).bool()
            returns = torch.where(mask, returns + return_shift[:, None], returns)
        out["token_returns"] = returns
    if "turn_ids" in wanted:
        out["turn_ids"] = _aligned([s.token_turns() for s in samples], width, -1, torch.long)
    if "episode_ids" in wanted:
        out["episode_ids"] = torch.tensor(episode_ids(samples, group_ids), dtype=torch.long)
    if "input_ids" in wanted:
        out["input_ids"] = _aligned([s.input_ids for s in samples], width, 0, torch.long)
    return out
