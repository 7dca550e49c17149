"""A task whose policy gradient is known exactly: the yardstick for turn-level credit assignment.

:class:`StoppingTask`: at each turn k < H the policy continues with probability p_k = σ(θ_k) (the
one-parameter policy of verl RFC #7244 is θ_k = θ for all k, whose gradient is the sum of the
components here) or stops; at turn H it must stop. A turn that continues earns c, the stopping turn
K earns f(K). So an episode is its length K ∈ {0, …, H}, with

    P(K ≥ k) = Π_{j<k} p_j,   r_k = c (k < K),   r_K = f(K),   G_k = c·(K − k) + f(K)   (γ = 1).

Writing μ_k = E[r_k | K ≥ k] = p_k·c + (1 − p_k)·f(k) (μ_H = f(H)) for the population mean of turn
k's reward over the episodes that reach it:

    J = Σ_k P(K ≥ k)·μ_k
    ∂J/∂θ_m = (1 − p_m)·Σ_{k>m} P(K ≥ k)·μ_k  +  P(K ≥ m)·p_m(1 − p_m)·(c − f(m))

(∂P(K ≥ k)/∂θ_m = (1 − p_m)·P(K ≥ k) for k > m; ∂μ_m/∂θ_m = p_m(1 − p_m)(c − f(m))). The first
term is the value of going on, the second the immediate price of going on instead of stopping.

The per-turn-index construction (:func:`per_turn_index_normalized_advantages`, MT-GRPO style)
subtracts Σ_{k=t}^{K} μ_k from G_t. Its expected gradient is ∇J + β with

    β = −∇_θ E_θ[Σ_{k=0}^{K} μ_k] (μ fixed),   β_m = −(1 − p_m)·Σ_{k>m} P(K ≥ k)·μ_k
      = −P(K ≥ m)·p_m(1 − p_m)·E[μ_{m+1} + … + μ_K | K ≥ m + 1]

(:meth:`StoppingTask.termination_bias`): every decision to take another turn is charged the
accumulated group mean of the turns it opens. Here it cancels the first term of ∂J/∂θ_m exactly.

Expectations are exact, never sampled: :func:`group_expectation` enumerates every group of n
episodes ((H + 1)^n of them) with its probability and runs an estimator on all of them as one
batch (:func:`episode_batch` lays the episodes out as the trainer does, turns merged into one
sample or split one sample per turn).
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

# Token ids of the layout: an observation renders the turn index, so the turn is the state.
PAD, PROMPT, END_OF_TURN, CONTINUE, STOP, FORCED_STOP = 0, 1, 2, 3, 4, 5
OBSERVATION = 10  # + turn index


@dataclass(frozen=True)
class StoppingTask:
    """Continue with probability σ(θ_k) at turn k < H, earning ``step_reward``; the stopping turn
    K earns ``final_rewards[K]``; turn H must stop."""

    logits: tuple[float, ...]  # θ_0 … θ_{H−1}
    step_reward: float  # c
    final_rewards: tuple[float, ...]  # f(0) … f(H)

    def __post_init__(self) -> None:
        if len(self.final_rewards) != len(self.logits) + 1:
            raise ValueError("final_rewards needs one entry per stopping turn 0 … H")

    @property
    def horizon(self) -> int:
        return len(self.logits)

    def continue_probs(self) -> Tensor:
        """``[H]``: p_k."""
        return torch.sigmoid(torch.tensor(self.logits, dtype=torch.float64))

    def reach_probs(self) -> Tensor:
        """``[H + 1]``: P(K ≥ k)."""
        ones = torch.ones(1, dtype=torch.float64)
        return torch.cat([ones, torch.cumprod(self.continue_probs(), 0)])

    def length_probs(self) -> Tensor:
        """``[H + 1]``: P(K = k)."""
        stops = torch.cat([1 - self.continue_probs(), torch.ones(1, dtype=torch.float64)])
        return self.reach_probs() * stops

    def turn_means(self) -> Tensor:
        """``[H + 1]``: μ_k = E[r_k | K ≥ k], the per-turn-index group mean of an infinite group."""
        p = self.continue_probs()
        f = torch.tensor(self.final_rewards, dtype=torch.float64)
        return torch.cat([p * self.step_reward + (1 - p) * f[:-1], f[-1:]])

    def objective(self) -> Tensor:
        """J = E[Σ_k r_k]."""
        return (self.reach_probs() * self.turn_means()).sum()

    def gradient(self) -> Tensor:
        """``[H]``: ∂J/∂θ_m in closed form (module docstring)."""
        p = self.continue_probs()
        f = torch.tensor(self.final_rewards[:-1], dtype=torch.float64)
        immediate = self.reach_probs()[:-1] * p * (1 - p) * (self.step_reward - f)
        return -self.termination_bias() + immediate

    def termination_bias(self) -> Tensor:
        """``[H]``: β_m = −(1 − p_m)·Σ_{k>m} P(K ≥ k)·μ_k, what the per-turn-index baseline adds to
        the expected gradient."""
        later = self.reach_probs() * self.turn_means()
        after = torch.flip(torch.cumsum(torch.flip(later, [0]), 0), [0])[1:]  # Σ_{k>m}
        return -(1 - self.continue_probs()) * after

    # --- one episode, by its length K ---

    def lengths(self) -> range:
        return range(self.horizon + 1)

    def turn_rewards(self, length: int) -> Tensor:
        """``[K + 1]``: r_0 … r_K."""
        r = torch.full((length + 1,), self.step_reward, dtype=torch.float64)
        r[length] = self.final_rewards[length]
        return r

    def returns(self, length: int) -> Tensor:
        """``[K + 1]``: G_k = Σ_{j≥k} r_j."""
        return torch.flip(torch.cumsum(torch.flip(self.turn_rewards(length), [0]), 0), [0])

    def scores(self, length: int) -> Tensor:
        """``[K + 1, H]``: ∇_θ log π(a_k) of each turn's decision (0 for the forced stop)."""
        p = self.continue_probs()
        out = torch.zeros(length + 1, self.horizon, dtype=torch.float64)
        for k in range(min(length + 1, self.horizon)):
            out[k, k] = 1 - p[k] if k < length else -p[k]
        return out

    def actions(self, length: int) -> list[int]:
        last = FORCED_STOP if length == self.horizon else STOP
        return [CONTINUE] * length + [last]


# --- the trainer's tensors for groups of episodes ----------------------------------------------


@dataclass(frozen=True)
class EpisodeBatch:
    """Groups of episodes as the estimators receive them, plus each token's score ``[N, T, H]``
    (∇_θ log π of the token; the end-of-turn token is certain, so its score is 0)."""

    tensors: dict[str, Tensor]
    scores: Tensor
    groups: int

    def inputs_for(self, estimator: Callable[..., Tensor]) -> dict[str, Tensor]:
        """The inputs the estimator's signature names, as the trainer passes them."""
        names = inspect.signature(estimator).parameters
        return {k: v for k, v in self.tensors.items() if k in names}

    def gradients(self, advantages: Tensor) -> Tensor:
        """``[groups, H]``: Σ over each group's tokens of A · ∇log π, the policy-gradient estimate
        the loss differentiates (summed over the group's episodes)."""
        per_sample = (advantages.to(torch.float64)[..., None] * self.scores).sum(dim=1)
        out = torch.zeros(self.groups, self.scores.shape[-1], dtype=torch.float64)
        return out.index_add_(0, self.tensors["group_ids"], per_sample)


def episode_batch(
    task: StoppingTask, groups: Sequence[Sequence[int]], layout: str = "merged"
) -> EpisodeBatch:
    """Group g holds episodes of lengths ``groups[g]`` (episode ids 0, 1, … within each group).

    A turn is its observation token (OBSERVATION + k; the prompt before turn 0), the action and an
    end-of-turn token; both generated. ``merged``: one sample per episode. ``split``: one sample
    per turn, its prompt being the whole episode so far, all masked."""
    if layout not in ("merged", "split"):
        raise ValueError(f"layout must be merged or split; got {layout!r}")
    samples: list[tuple[int, int, list[int], list[int], list[float], list[Tensor]]] = []
    for g, lengths in enumerate(groups):
        for e, length in enumerate(lengths):
            tokens, turns, returns, scores = [PROMPT], [-1], [0.0], [torch.zeros(task.horizon)]
            g_k, s_k = task.returns(length), task.scores(length)
            for k, action in enumerate(task.actions(length)):
                if layout == "split":
                    turns = [-1] * len(turns)
                tokens += [OBSERVATION + k, action, END_OF_TURN]
                turns += [-1, k, k]
                returns += [0.0, float(g_k[k]), float(g_k[k])]
                scores += [torch.zeros(task.horizon), s_k[k], torch.zeros(task.horizon)]
                if layout == "split":
                    samples.append((g, e, list(tokens), list(turns), list(returns), list(scores)))
            if layout == "merged":
                samples.append((g, e, tokens, turns, returns, scores))
    width = max(len(s[2]) for s in samples)
    n = len(samples)
    input_ids = torch.full((n, width), PAD, dtype=torch.long)
    turn_ids = torch.full((n, width), -1, dtype=torch.long)
    token_returns = torch.zeros(n, width, dtype=torch.float64)
    score = torch.zeros(n, width, task.horizon, dtype=torch.float64)
    for i, (_, _, tokens, turns, returns, scores) in enumerate(samples):
        input_ids[i, : len(tokens)] = torch.tensor(tokens)
        turn_ids[i, : len(turns)] = torch.tensor(turns)
        token_returns[i, : len(returns)] = torch.tensor(returns, dtype=torch.float64)
        score[i, : len(scores)] = torch.stack(scores).to(torch.float64)
    mask = turn_ids >= 0
    token_returns, score = token_returns * mask, score * mask[..., None]
    first_turn = torch.where(mask, turn_ids, width).argmin(dim=1)
    tensors = {
        "rewards": token_returns[torch.arange(n), first_turn],
        "group_ids": torch.tensor([s[0] for s in samples]),
        "episode_ids": torch.tensor([s[1] for s in samples]),
        "loss_mask": mask.to(torch.int64),
        "token_returns": token_returns,
        "turn_ids": turn_ids,
        "input_ids": input_ids,
    }
    return EpisodeBatch(tensors=tensors, scores=score, groups=len(groups))


# --- exact expectations -------------------------------------------------------------------------


def all_groups(task: StoppingTask, size: int) -> tuple[list[tuple[int, ...]], Tensor]:
    """Every group of ``size`` independent episodes, as lengths, and its probability."""
    groups = list(itertools.product(task.lengths(), repeat=size))
    p = task.length_probs()
    probs = torch.tensor([math.prod(float(p[k]) for k in g) for g in groups], dtype=torch.float64)
    return groups, probs


def group_expectation(
    task: StoppingTask,
    estimator: Callable[..., Tensor],
    size: int,
    layout: str = "merged",
    **options: object,
) -> Tensor:
    """``[H]``: the exact expected policy-gradient estimate per episode, E[Σ_t A_t ∇log π(a_t)],
    of ``estimator`` run on groups of ``size`` episodes."""
    groups, probs = all_groups(task, size)
    batch = episode_batch(task, groups, layout)
    advantages = estimator(**batch.inputs_for(estimator), **options)
    return (probs[:, None] * batch.gradients(advantages)).sum(dim=0) / size


def expectation_over_others(
    task: StoppingTask, others: int, value: Callable[[tuple[int, ...]], float]
) -> float:
    """E[value(lengths of ``others`` independent episodes)], by enumeration."""
    groups, probs = all_groups(task, others)
    return sum(float(p) * value(g) for g, p in zip(groups, probs))


# --- the biased construction --------------------------------------------------------------------


def per_turn_index_normalized_advantages(
    turn_rewards: Tensor,
    reached: Tensor,
    turn_means: Tensor | None = None,
    normalize_std: bool = False,
    eps: float = 1e-6,
) -> Tensor:
    """MT-GRPO-style per-turn-index normalisation, the construction verl RFC #7244 shows biased.

    ``turn_rewards`` and ``reached`` are ``[E, H + 1]`` tables of one group's episodes (``reached``
    is 1 on the turns an episode played). Â_{i,k} = (r_{i,k} − μ_k) / σ_k over the episodes that
    reached turn k, and A_{i,t} = Σ_{k=t}^{K_i} Â_{i,k}; 0 on turns not played. ``turn_means``
    replaces the group's μ_k by given values (an infinite group's: :meth:`StoppingTask.turn_means`).
    Kept in the tests only, as the thing the shipped estimator must not be."""
    played = reached.bool()
    r = torch.where(played, turn_rewards.to(torch.float64), 0.0)
    count = played.sum(dim=0)
    if turn_means is None:
        turn_means = r.sum(dim=0) / count.clamp(min=1)
    centred = torch.where(played, r - turn_means, 0.0)
    if normalize_std:
        var = (centred**2).sum(dim=0) / (count - 1).clamp(min=1)
        centred = centred / (var.sqrt() + eps)
    later_sums = torch.flip(torch.cumsum(torch.flip(centred, [1]), 1), [1])
    return torch.where(played, later_sums, 0.0)


def per_turn_index_expected_gradient(task: StoppingTask) -> Tensor:
    """``[H]``: E[Σ_t A_t ∇log π(a_t)] of :func:`per_turn_index_normalized_advantages` with the
    group means at their population values μ_k, enumerating the episode lengths."""
    out = torch.zeros(task.horizon, dtype=torch.float64)
    for length, p in zip(task.lengths(), task.length_probs()):
        rewards = torch.zeros(1, task.horizon + 1, dtype=torch.float64)
        rewards[0, : length + 1] = task.turn_rewards(length)
        reached = torch.zeros(1, task.horizon + 1, dtype=torch.bool)
        reached[0, : length + 1] = True
        adv = per_turn_index_normalized_advantages(rewards, reached, task.turn_means())
        out += p * (adv[0, : length + 1, None] * task.scores(length)).sum(dim=0)
    return out
