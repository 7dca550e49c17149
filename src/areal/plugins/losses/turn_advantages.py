"""Turn-level advantage estimators for agents whose episodes last as long as the policy decides.

Shapes as in :mod:`areal.plugins.losses.advantages` (``N`` samples, ``T`` positions), plus what a
multi-turn batch carries: ``token_returns`` ``[N, T]``, on each generated token the discounted
return-to-go ``G_k = r_k + γ·G_{k+1}`` of the turn ``k`` it belongs to (the episode reward added at
the last turn); ``turn_ids`` ``[N, T]``, the episode-global 0-based turn of each generated token
(−1 elsewhere); ``episode_ids`` ``[N]``. An episode's turns may sit in one sample (turns merged, the
environment's tokens masked in between) or be split over several; the estimators only look at the
*(episode, turn)* cells, so both layouts give the same advantages. Episodes are named by
``(group_ids, episode_ids)``: episode ids need only be unique within a group.

Why not normalise per turn index. The natural construction (MT-GRPO style, Wei et al. 2025; verl
RFC #7244) normalises each turn's reward over the group's episodes that reached that turn and sums
the later ones::

    Â_{i,k} = (r_{i,k} − μ_k) / σ_k,      A_{i,t} = Σ_{k=t}^{K_i} Â_{i,k}

With σ = 1 this is ``G_{i,t} − Σ_{k=t}^{K_i} μ_k``: a baseline with one term per turn the episode
goes on to play, i.e. set by the episode's own stopping turn ``K_i``. A baseline that depends on the
action it judges is no baseline: whenever the policy decides when to stop, the expected gradient
(μ_k at its large-group value) is::

    E[ĝ] = ∇J − ∇_θ E_θ[Σ_{k=0}^{K} μ_k]      (μ held at its value)
         = ∇J − E[(Σ_{k=0}^{K} μ_k) · ∇_θ log P_θ(τ)],

a hidden cost of the accumulated group mean μ_{t+1} + μ_{t+2} + … on every decision to take another
turn. Where the turn index is the whole state it cancels the value of going on exactly: the
estimator then sees only each turn's immediate reward. ``tests/support/turn_credit_task.py`` gives
a task where all of this is computed in closed form, and the tests check it.

What ships instead:

- :func:`turn_token_advantages` (``advantage/turn``): the return-to-go of each turn minus the mean
  return-to-go of the *other* episodes of the group at the same turn. The baseline never depends on
  the episode it judges, so the gradient is unbiased (see its docstring for the exact statement).
- :func:`gigpo_token_advantages` (``advantage/gigpo``): GiGPO (Feng et al. 2025), an episode-level
  GRPO advantage plus a step-level one computed within groups of steps that start from the same
  state.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from areal.plugins.losses.advantages import (
    _check_single,
    _check_tokens,
    _floating,
    _group_stats,
    grpo_advantages,
)

__all__ = ["STEP_KEYS", "gigpo_token_advantages", "turn_token_advantages"]

STEP_KEYS = ("observation", "history")


# --- the batch as (episode, turn) cells --------------------------------------------------------


class _Turns(NamedTuple):
    """The batch's turns: one *cell* per (episode, turn) with generated tokens.

    Cells are sorted by episode, then turn. Episodes and groups are compact indices (0, 1, …) over
    the episodes that have a cell."""

    mask: Tensor  # [N, T] bool: the generated tokens
    token_cell: Tensor  # [M]: the cell of each generated token, in mask order
    returns: Tensor  # [C] float64: the turn's G
    turn: Tensor  # [C]
    episode: Tensor  # [C]
    group: Tensor  # [C]
    episode_group: Tensor  # [E]
    episode_return: Tensor  # [E] float64: G at the episode's earliest turn in the batch


def _turn_cells(
    group_ids: Tensor,
    loss_mask: Tensor,
    token_returns: Tensor,
    turn_ids: Tensor,
    episode_ids: Tensor,
) -> _Turns:
    _check_tokens(loss_mask, token_returns, turn_ids)
    n = loss_mask.shape[0]
    for name, ids in (("group_ids", group_ids), ("episode_ids", episode_ids)):
        if ids.shape != (n,):
            raise ValueError(f"{name} must be [N] = [{n}]; got {tuple(ids.shape)}")
    mask = loss_mask.bool()
    turns = turn_ids[mask].long()
    if turns.numel() and int(turns.min()) < 0:
        raise ValueError("every generated token needs its turn: turn_ids < 0 where loss_mask is 1")

    _, sample_group = torch.unique(group_ids, return_inverse=True)
    pairs = torch.stack([sample_group, episode_ids.long()], dim=1)
    _, sample_episode = torch.unique(pairs, dim=0, return_inverse=True)
    slots = int(turns.max()) + 1 if turns.numel() else 1
    token_episode = sample_episode[:, None].expand_as(mask)[mask]
    cell_key, token_cell = torch.unique(token_episode * slots + turns, return_inverse=True)

    g = token_returns[mask].to(torch.float64)
    c = cell_key.numel()
    low = g.new_zeros(c).scatter_reduce(0, token_cell, g, "amin", include_self=False)
    high = g.new_zeros(c).scatter_reduce(0, token_cell, g, "amax", include_self=False)
    if not torch.isclose(low, high, rtol=1e-5, atol=1e-8).all():
        raise ValueError("token_returns must hold one value per turn: the turn's return-to-go G_k")

    raw_episode, episode, per_episode = torch.unique_consecutive(
        cell_key // slots, return_inverse=True, return_counts=True
    )
    episodes = int(sample_episode.max()) + 1 if n else 0
    groups_of = torch.zeros(episodes, dtype=torch.long, device=mask.device)
    groups_of = groups_of.scatter_(0, sample_episode, sample_group)
    episode_group = groups_of[raw_episode]
    first_cell = torch.cumsum(per_episode, 0) - per_episode
    return _Turns(
        mask=mask,
        token_cell=token_cell,
        returns=high,
        turn=cell_key % slots,
        episode=episode,
        group=episode_group[episode],
        episode_group=episode_group,
        episode_return=high[first_cell],
    )


def _to_tokens(cell_values: Tensor, turns: _Turns, like: Tensor) -> Tensor:
    """Each cell's value on its generated tokens, 0 elsewhere, in ``like``'s float type."""
    out = torch.zeros(turns.mask.shape, dtype=torch.float64, device=turns.mask.device)
    out[turns.mask] = cell_values[turns.token_cell]
    return out.to(_floating(like).dtype)


# --- advantage/turn ----------------------------------------------------------------------------


def turn_token_advantages(
    *,
    rewards: Tensor,
    group_ids: Tensor,
    loss_mask: Tensor,
    token_returns: Tensor,
    turn_ids: Tensor,
    episode_ids: Tensor,
    normalize_std: bool = False,
    eps: float = 1e-6,
    single_sample: str = "reward",
) -> Tensor:
    """``advantage/turn``: each turn's return-to-go against the other episodes at that turn.

    For episode i of a group and turn t it reached, every generated token of the turn gets::

        A_{i,t} = G_{i,t} − b_{i,t},   b_{i,t} = mean{ G_{j,t} : j ≠ i in the group, K_j ≥ t }

    (leave-one-out over the episodes that reached turn t). The baseline is made of other episodes
    only, which are independent of episode i, so ``E[b_{i,t} ∇log π(a_{i,t})] = 0`` however long
    each episode runs: the per-turn-index bias (module docstring) cannot arise, and the intermediate
    rewards are credited exactly where they were earned. With one turn per episode this is RLOO
    (:func:`~areal.plugins.losses.advantages.rloo_advantages`).

    A turn no other episode of the group reached has no baseline. ``single_sample: reward`` (the
    default here, unlike GRPO's and RLOO's) gives it ``A = G_{i,t}`` (baseline 0): the expected
    gradient is then exactly ∇J, at the price of an uncentred term. ``zero`` gives it 0, as RLOO
    does a group of one; whether it is 0 depends only on
    the other episodes, so no action-dependent term enters either, but turn t's decisions are
    weighted by the chance ``w_t`` that some other episode reaches turn t (``w_0 = 1``): the
    expected gradient is ``Σ_t w_t · ∇_t J``, which keeps every per-turn direction but, with
    parameters shared across turns, under-weights the rarely reached late turns.

    ``normalize_std`` divides all of episode i's advantages by ``s_{−i} + eps``, the standard
    deviation (n − 1 denominator) of the *other* episodes' returns (G at their first turn): GRPO's
    scale, leave-one-out as NeMo-RL computes it with its leave-one-out baseline. For a fixed group
    the factor does not depend on episode i's actions, so within a task the expected gradient is
    only scaled, by ``E[1/(s_{−i} + eps)]``: no turn is re-weighted against another. Where there is
    no spread to measure (fewer than two others, or others that all returned the same) the episode
    is not scaled, as NeMo-RL skips zero-std samples; that rule, too, reads only the others. What it
    costs: GRPO's task weighting (tasks whose returns barely vary weigh more), and no bound on the
    result: an episode far from others that nearly agree gets a large advantage. The alternatives
    were worse for this estimator: the group's std including the episode is bounded but depends on
    the episode's own return, which shrinks the weight of long, extreme episodes and so of late
    turns (in the tests' first task, with groups of three, turn 2's decisions get about half the
    weight of turn 0's);
    a per-turn std of the others' G_{j,t} re-weights turns against each other, amplifying turns
    whose outcome is all but settled. For a fixed scale across tasks, prefer ``advantage_norm:
    batch`` on top of the unscaled estimator.

    ``rewards`` is accepted for the common signature and unused: the returns come per turn, in
    ``token_returns``. Computed in float64 and returned in ``token_returns``' float type.
    """
    del rewards
    _check_single(single_sample)
    turns = _turn_cells(group_ids, loss_mask, token_returns, turn_ids, episode_ids)
    g = turns.returns
    _, at_turn = torch.unique(
        torch.stack([turns.group, turns.turn], dim=1), dim=0, return_inverse=True
    )
    buckets = int(at_turn.max()) + 1 if g.numel() else 0
    reached = g.new_zeros(buckets).index_add_(0, at_turn, torch.ones_like(g))[at_turn]
    total = g.new_zeros(buckets).index_add_(0, at_turn, g)[at_turn]
    others = reached - 1
    baseline = (total - g) / others.clamp(min=1)
    alone = g if single_sample == "reward" else torch.zeros_like(g)
    adv = torch.where(others > 0, g - baseline, alone)
    if normalize_std:
        adv = adv / _others_return_spread(turns, eps)[turns.episode]
    return _to_tokens(adv, turns, token_returns)


def _others_return_spread(turns: _Turns, eps: float) -> Tensor:
    """Per episode ``[E]``: ``std + eps`` of the other episodes' returns in its group, or 1 where
    the others have no spread (fewer than two of them, or all equal)."""
    r, group = turns.episode_return, turns.episode_group
    size, total, sq_dev = _group_stats(r, group)
    others = size - 1
    # Taking one value out of a set:
    # Σ_{j≠i} (r_j − mean_{−i})² = Σ_j (r_j − mean)² − (r_i − mean)²·n/(n−1).
    sq_dev_others = (sq_dev - (r - total / size) ** 2 * size / others.clamp(min=1)).clamp(min=0)
    std = torch.sqrt(sq_dev_others / (others - 1).clamp(min=1))
    spread = (others >= 2) & ~_others_agree(r, group, size)
    return torch.where(spread, std + eps, 1.0)


def _others_agree(r: Tensor, group: Tensor, size: Tensor) -> Tensor:
    """Per episode: whether all the other episodes of its group have one return, decided exactly
    (from the group's extremes and how many episodes sit at each) rather than by a rounded std."""
    groups = int(group.max()) + 1 if group.numel() else 0
    low = r.new_zeros(groups).scatter_reduce(0, group, r, "amin", include_self=False)[group]
    high = r.new_zeros(groups).scatter_reduce(0, group, r, "amax", include_self=False)[group]
    at_low = r.new_zeros(groups).index_add_(0, group, (r == low).to(r.dtype))[group]
    at_high = r.new_zeros(groups).index_add_(0, group, (r == high).to(r.dtype))[group]
    lone_low = (r == low) & (at_low == 1) & (at_high == size - 1)
    lone_high = (r == high) & (at_high == 1) & (at_low == size - 1)
    return (low == high) | lone_low | lone_high


# --- advantage/gigpo ---------------------------------------------------------------------------


def gigpo_token_advantages(
    *,
    rewards: Tensor,
    group_ids: Tensor,
    loss_mask: Tensor,
    token_returns: Tensor,
    turn_ids: Tensor,
    episode_ids: Tensor,
    input_ids: Tensor,
    step_weight: float = 1.0,
    step_key: str = "observation",
    normalize_std: bool = True,
    eps: float = 1e-6,
    single_sample: str = "zero",
) -> Tensor:
    """``advantage/gigpo``: Group-in-Group Policy Optimization (Feng et al. 2025, arXiv 2505.10978).

    Every generated token of turn t of episode i gets::

        A_{i,t} = A^E_i + step_weight · A^S_{i,t}
        A^E_i   = (R_i − mean_g R) / (std_g R + eps)                 over the group's episodes
        A^S_{i,t} = (G_{i,t} − mean_s G) / (std_s G + eps)           over the step group s of (i, t)

    ``R_i`` is the episode's return (G at its first turn); a step group is every (episode, turn) of
    the same task group whose turn starts from the same *anchor state*, wherever in the episode it
    comes (an episode that returns to a state joins that state's group twice). Means and stds are
    GRPO's (n − 1 denominator; ``normalize_std=False`` keeps the means only, the paper's F_norm = 1
    and verl-agent's ``mean_norm`` mode). A step group of one has no comparison: A^S = 0 (both
    references do the same). A task group of one follows ``single_sample`` as in
    :func:`~areal.plugins.losses.advantages.grpo_advantages` (verl-agent's rule is ``reward``,
    ROLL's ``zero``). With ``step_weight=0`` this is GRPO on
    the episode returns.

    ``step_key`` picks the anchor: ``observation`` is the tokens of the turn's new context, the
    masked span right before the turn's first generated token in its sample (the tool result or
    user message; for a sample's first turn, its whole prompt); ``history`` is every token of the
    sample before that token. ``observation`` is GiGPO's anchor when the environment renders its
    whole state in each observation, as in the paper's ALFWorld and WebShop setups and ROLL's
    ``StepEnvManager`` (which keys steps by a hash of the current observation); for a chat agent the
    state is the history, so ``history`` groups only truly identical states, and more rarely. In a
    sample whose prompt already holds earlier turns (turns split over samples) the masked span is
    that whole prompt, so both keys agree there. Spans are compared by length and by polynomial
    hashes of their tokens modulo two 30-bit primes (ROLL compares hashes too): two different
    spans of one task collide with odds of about 10⁻¹⁸. Samples are assumed right-padded (no
    padding inside a span). In the trainer's prediction-aligned layout (column t holds token
    t + 1) a sample's first token is not in any span; it is the same for every episode of a task.

    What was matched, from the paper (Eqs. 3, 5–8) and two implementations (ROLL's
    ``roll/pipeline/agentic/utils.py``, verl-agent's ``gigpo/core_gigpo.py``): the episode-level
    statistics are over episodes, one return each (Eq. 3; ROLL, and verl-agent by default, pool
    them over step samples, so that an episode weighs by its number of turns: not done here);
    ``G_{i,t}`` is the discounted return-to-go (Eq. 5, ROLL's ``step_reward_gamma``, applied
    upstream in ``token_returns``); steps are grouped by exact anchor equality within the task
    group (Eq. 6; verl-agent's optional similarity clustering is not offered); the two levels add
    with ``step_weight`` (Eq. 8: verl-agent's ``step_advantage_w``, ROLL's ``step_reward_weight``
    with ``episode_reward_weight = 1``). When γ < 1, ``R_i`` is the discounted return, where the
    paper's episode level uses the undiscounted sum.

    GiGPO is not unbiased in general: each mean includes the step being judged, the stds are
    action-dependent, and a revisited state's group holds the same episode's later steps. It does
    not have the per-turn-index termination bias, because it compares returns-to-go. A turn's
    tokens must lie in one sample (its anchor is read there). ``rewards`` is unused, as in
    :func:`turn_token_advantages`.
    """
    del rewards
    if step_key not in STEP_KEYS:
        raise ValueError(f"step_key must be one of {', '.join(STEP_KEYS)}; got {step_key!r}")
    _check_single(single_sample)
    _check_tokens(loss_mask, input_ids)
    turns = _turn_cells(group_ids, loss_mask, token_returns, turn_ids, episode_ids)
    episode_adv = grpo_advantages(
        turns.episode_return,
        turns.episode_group,
        eps=eps,
        normalize_std=normalize_std,
        single_sample=single_sample,
    )
    step_adv = grpo_advantages(
        turns.returns,
        _anchor_groups(turns, input_ids, step_key),
        eps=eps,
        normalize_std=normalize_std,
        single_sample="zero",
    )
    return _to_tokens(episode_adv[turns.episode] + step_weight * step_adv, turns, token_returns)


def _anchor_groups(turns: _Turns, input_ids: Tensor, step_key: str) -> Tensor:
    """Per cell ``[C]``: its step group, cells of one task group whose anchor spans are equal."""
    mask = turns.mask
    n, t = mask.shape
    position = torch.arange(t, device=mask.device).expand(n, t)
    sample = torch.arange(n, device=mask.device)[:, None].expand(n, t)
    c = turns.returns.numel()
    cell_sample = _per_cell(sample[mask], turns.token_cell, c, "amin")
    if not torch.equal(cell_sample, _per_cell(sample[mask], turns.token_cell, c, "amax")):
        raise ValueError("a turn's generated tokens must lie in one sample for GiGPO's anchor")
    end = _per_cell(position[mask], turns.token_cell, c, "amin")  # the turn's first token
    if step_key == "history":
        start = torch.zeros_like(end)
    else:
        last_generated = torch.where(mask, position, -1).cummax(dim=1).values
        before = last_generated[cell_sample, (end - 1).clamp(min=0)]
        start = torch.where(end > 0, before, -1) + 1
    key = [turns.group, end - start, *_span_hashes(input_ids, cell_sample, start, end)]
    _, anchor = torch.unique(torch.stack(key, dim=1), dim=0, return_inverse=True)
    return anchor


def _per_cell(values: Tensor, token_cell: Tensor, cells: int, reduce: str) -> Tensor:
    return values.new_zeros(cells).scatter_reduce(0, token_cell, values, reduce, include_self=False)


# Two (prime modulus, base) pairs: ~2^30 each, so every product of two residues fits in int64.
_HASHES = ((1_000_000_007, 911_382_323), (998_244_353, 972_663_749))


def _span_hashes(input_ids: Tensor, sample: Tensor, start: Tensor, end: Tensor) -> list[Tensor]:
    """``Σ_{j<L} x_{start+j} · B^j mod P`` of each span ``input_ids[sample, start:end]``
    (x = id + 1, so that token 0 counts), for each (P, B) of :data:`_HASHES`: one prefix sum per
    row, then one multiplication by ``B^{−start}`` per span, so no Python loop over spans or
    tokens."""
    n, t = input_ids.shape
    x = input_ids.long() + 1
    hashes = []
    for modulus, base in _HASHES:
        power = _powers(base, t + 1, modulus, x.device)
        inverse = _powers(pow(base, modulus - 2, modulus), t + 1, modulus, x.device)
        prefix = torch.zeros(n, t + 1, dtype=torch.long, device=x.device)
        prefix[:, 1:] = torch.cumsum(x % modulus * power[:t] % modulus, dim=1) % modulus
        span = (prefix[sample, end] - prefix[sample, start]) % modulus
        hashes.append(span * inverse[start] % modulus)
    return hashes


def _powers(base: int, count: int, modulus: int, device: torch.device) -> Tensor:
    """``base^k mod modulus`` for k < count, by doubling."""
    out = torch.ones(1, dtype=torch.long, device=device)
    while out.numel() < count:
        out = torch.cat([out, out * pow(base, out.numel(), modulus) % modulus])
    return out[:count]
