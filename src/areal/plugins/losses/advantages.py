"""Advantage estimators and reward shaping: pure functions over tensors, CPU-testable.

Shapes: ``N`` samples, ``T`` token positions. Sequence-level quantities are ``[N]``; token-level
ones are ``[N, T]`` with a ``loss_mask`` ``[N, T]`` (1 = a generated token the policy is trained
on; prompt, padding and environment tokens in between are 0). ``group_ids`` ``[N]`` (any integers)
say which samples answer the same task: GRPO and RLOO compare a sample only with its group.

The pipeline AReaL uses and these pieces compose into: sequence rewards → optionally
group-normalised (:func:`grpo_advantages`) → placed on the last generated token, with an optional
per-token KL-to-reference penalty (:func:`kl_penalized_rewards`) → GAE without a critic
(:func:`gae_no_critic_advantages`, values ≡ 0). With γ = λ = 1 and no KL term that is exactly
"broadcast the sequence advantage to every generated token" (:func:`broadcast_to_tokens`).

The ``*_token_advantages`` functions at the end share one keyword signature and are what the
``advantage/<name>`` registry entries point to, so the trainer can pick one by name. Each also
takes ``token_returns`` ``[N, T]``, the return of the turn each token belongs to
(:mod:`areal.plugins.trainer.turn_inputs`): a token is credited with its own turn's return
rather than its sample's, so a reward for turn 1 reaches turn 1's tokens and no later ones. With
one turn per sample, or no per-turn rewards and a discount of 1, every token's return is its
sample's reward and each estimator is exactly its sequence-level form.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "SINGLE_SAMPLE",
    "broadcast_to_tokens",
    "gae_advantages",
    "gae_no_critic_advantages",
    "gae_token_advantages",
    "grpo_advantages",
    "grpo_token_advantages",
    "kl_penalized_rewards",
    "normalize_batch_advantages",
    "rloo_advantages",
    "rloo_token_advantages",
    "sequence_rewards_to_tokens",
    "turn_rewards_on_tokens",
]


# --- sequence level: [N] -> [N] ---------------------------------------------------------------


def _group_stats(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per sample: its group's size, sum of rewards and sum of squared deviations, each ``[N]``."""
    if rewards.dim() != 1 or rewards.shape != group_ids.shape:
        raise ValueError(
            f"rewards and group_ids must both be [N]; got {tuple(rewards.shape)} "
            f"and {tuple(group_ids.shape)}"
        )
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    r = rewards.to(torch.float64)  # sums of many rewards: keep precision, cast back at the end
    size = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(
        0, inverse, torch.ones_like(r)
    )
    total = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, inverse, r)
    mean = total / size
    sq_dev = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(
        0, inverse, (r - mean[inverse]) ** 2
    )
    return size[inverse], total[inverse], sq_dev[inverse]


SINGLE_SAMPLE = ("zero", "reward")


def grpo_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    eps: float = 1e-6,
    normalize_std: bool = True,
    single_sample: str = "zero",
) -> Tensor:
    """GRPO (Shao et al. 2024): ``A_i = (r_i − mean_g) / (std_g + eps)`` over sample i's group g.

    ``rewards`` ``[N]`` → advantages ``[N]``. ``std_g`` is the unbiased (n − 1) standard deviation,
    as in DeepSeekMath, TRL and verl. ``normalize_std=False`` keeps only the mean baseline (Dr.
    GRPO, Liu et al. 2025), which does not up-weight tasks whose rewards barely differ.

    A group of one has no baseline. ``single_sample: zero`` (the default) gives it advantage 0: it
    has nothing to be compared with, so it teaches nothing. ``reward`` is verl's rule: baseline 0
    and std 1, so ``A = r / (1 + eps)`` (``r`` without ``normalize_std``), a plain REINFORCE term
    whose scale depends on the reward's.
    """
    _check_single(single_sample)
    size, total, sq_dev = _group_stats(rewards, group_ids)
    r = rewards.to(torch.float64)
    alone = size == 1
    centred = torch.where(alone, r if single_sample == "reward" else 0.0, r - total / size)
    if normalize_std:
        std = torch.where(alone, 1.0, torch.sqrt(sq_dev / (size - 1).clamp(min=1)))
        centred = centred / (std + eps)
    return centred.to(_floating(rewards).dtype)


def rloo_advantages(rewards: Tensor, group_ids: Tensor, single_sample: str = "zero") -> Tensor:
    """REINFORCE leave-one-out (Ahmadian et al. 2024): ``A_i = r_i − mean_{j≠i, j∈g} r_j``.

    ``rewards`` ``[N]`` → ``[N]``. The baseline excludes the sample itself, so it is unbiased. A
    group of one has no other sample: advantage 0 (``single_sample: zero``, the default), or its
    reward (``reward``: verl's rule).
    """
    _check_single(single_sample)
    size, total, _ = _group_stats(rewards, group_ids)
    r = rewards.to(torch.float64)
    others = (size - 1).clamp(min=1)
    alone = r if single_sample == "reward" else torch.zeros_like(r)
    adv = torch.where(size > 1, r - (total - r) / others, alone)
    return adv.to(_floating(rewards).dtype)


def _check_single(single_sample: str) -> None:
    if single_sample not in SINGLE_SAMPLE:
        raise ValueError(
            f"single_sample must be one of {', '.join(SINGLE_SAMPLE)}; got {single_sample!r}"
        )


# --- sequence -> token ------------------------------------------------------------------------


def _floating(x: Tensor) -> Tensor:
    """Integer rewards (0/1 from a rule) become the default float type; float types are kept."""
    return x if x.is_floating_point() else x.to(torch.get_default_dtype())


def _check_tokens(loss_mask: Tensor, *tensors: Tensor) -> None:
    if loss_mask.dim() != 2:
        raise ValueError(f"loss_mask must be [N, T]; got {tuple(loss_mask.shape)}")
    for t in tensors:
        if t.shape != loss_mask.shape:
            raise ValueError(f"expected [N, T] = {tuple(loss_mask.shape)}; got {tuple(t.shape)}")


def broadcast_to_tokens(values: Tensor, loss_mask: Tensor) -> Tensor:
    """A sequence-level value ``[N]`` copied onto each generated token of its sample ``[N, T]``
    (zero elsewhere): how GRPO and RLOO advantages reach the token-level loss."""
    _check_tokens(loss_mask)
    mask = loss_mask.bool()
    return torch.where(mask, _floating(values)[:, None], 0.0)


def sequence_rewards_to_tokens(rewards: Tensor, loss_mask: Tensor) -> Tensor:
    """A sequence reward ``[N]`` placed on the last generated token of its sample ``[N, T]``.

    The reward arrives when the episode ends, so the last action gets it; GAE carries it back. A
    sample with no generated token gets nothing.
    """
    _check_tokens(loss_mask)
    mask = loss_mask.bool()
    n, t = mask.shape
    last = (t - 1) - mask.flip(-1).to(torch.int8).argmax(dim=-1)  # [N]
    rewards = _floating(rewards)
    out = torch.zeros(n, t, dtype=rewards.dtype, device=rewards.device)
    out[torch.arange(n, device=out.device), last] = rewards
    return torch.where(mask, out, 0.0)


def kl_penalized_rewards(
    rewards: Tensor, logprobs: Tensor, ref_logprobs: Tensor, loss_mask: Tensor, kl_coef: float
) -> Tensor:
    """Token rewards ``[N, T]`` with a KL-to-reference penalty, as in InstructGPT and AReaL.

    Each generated token gets ``−kl_coef · (log π(a_t) − log π_ref(a_t))`` (the k1 estimate of
    KL(π ‖ π_ref) along the sampled sequence, using the rollout's ``logprobs`` ``[N, T]``); the
    sequence reward ``rewards`` ``[N]`` is added on the last generated token. Feed the result to
    :func:`gae_no_critic_advantages` or :func:`gae_advantages`. Masked positions may hold -inf.
    """
    _check_tokens(loss_mask, logprobs, ref_logprobs)
    mask = loss_mask.bool()
    kl = torch.where(mask, logprobs.detach(), 0.0) - torch.where(mask, ref_logprobs.detach(), 0.0)
    return sequence_rewards_to_tokens(rewards, loss_mask) - kl_coef * kl


# --- token level: GAE -------------------------------------------------------------------------


def gae_advantages(
    rewards_per_token: Tensor, values: Tensor, loss_mask: Tensor, gamma: float, lam: float
) -> Tensor:
    """Generalised advantage estimation (Schulman et al. 2016) over the generated tokens.

    ``rewards_per_token``, ``values`` and ``loss_mask`` are ``[N, T]``; returns advantages
    ``[N, T]`` (zero at masked positions; the critic's targets are ``advantages + values``)::

        δ_t = r_t + γ · V_{t'} − V_t,   A_t = δ_t + γλ · A_{t'}

    where t' is the *next generated token* of the same sample (V = A = 0 after the last one). The
    recursion skips masked positions, so tool results or other environment tokens between two turns
    merged into one sequence are not steps of the MDP; rewards placed on masked positions are
    ignored. Computed by a backward loop over T on [N]-vectors.
    """
    _check_tokens(loss_mask, rewards_per_token, values)
    mask = loss_mask.bool()
    r = torch.where(mask, _floating(rewards_per_token), 0.0)
    dtype = r.dtype
    v = torch.where(mask, values.detach(), 0.0).to(dtype)
    n, t_len = mask.shape
    adv = torch.zeros(n, t_len, dtype=dtype, device=r.device)
    next_value = torch.zeros(n, dtype=dtype, device=r.device)
    next_adv = torch.zeros(n, dtype=dtype, device=r.device)
    for t in range(t_len - 1, -1, -1):
        delta = r[:, t] + gamma * next_value - v[:, t]
        a_t = delta + gamma * lam * next_adv
        m = mask[:, t]
        adv[:, t] = torch.where(m, a_t, 0.0)
        next_value = torch.where(m, v[:, t], next_value)
        next_adv = torch.where(m, a_t, next_adv)
    return adv


def gae_no_critic_advantages(
    rewards_per_token: Tensor, loss_mask: Tensor, gamma: float = 1.0, lam: float = 1.0
) -> Tensor:
    """GAE with values ≡ 0, as AReaL uses it without a critic: ``A_t = Σ_{k≥t} (γλ)^{k−t} r_k``
    over the generated tokens. ``[N, T]`` → ``[N, T]``."""
    values = torch.zeros_like(_floating(rewards_per_token))
    return gae_advantages(rewards_per_token, values, loss_mask, gamma, lam)


# --- batch level -------------------------------------------------------------------------------


def normalize_batch_advantages(advantages: Tensor, loss_mask: Tensor, eps: float = 1e-5) -> Tensor:
    """``algorithm.advantage_norm: batch`` (AReaL's ``adv_norm``): ``(A − mean) / (std + eps)``
    with the mean and the population std over *all valid tokens of the batch*, whatever sample
    they belong to; 0 at masked positions. Any shape; an empty batch is returned as zeros.

    Long answers weigh by their tokens, as in the loss. After GRPO this rescales the step's
    gradient to a fixed size, whatever the reward scale.
    """
    _check_same(advantages, loss_mask)
    mask = loss_mask.bool()
    a = torch.where(mask, _floating(advantages), 0.0).to(torch.float64)
    n = mask.sum().clamp(min=1).to(torch.float64)
    mean = a.sum() / n
    var = torch.where(mask, (a - mean) ** 2, 0.0).sum() / n
    out = torch.where(mask, (a - mean) / (var.sqrt() + eps), 0.0)
    return out.to(_floating(advantages).dtype)


def _check_same(advantages: Tensor, loss_mask: Tensor) -> None:
    if advantages.shape != loss_mask.shape:
        raise ValueError(
            f"advantages {tuple(advantages.shape)} and loss_mask {tuple(loss_mask.shape)} must "
            "share one shape"
        )


# --- the registered estimators: one keyword signature, [N] rewards -> [N, T] advantages ---------


def _per_turn(
    adv: Tensor,
    rewards: Tensor,
    token_returns: Tensor | None,
    loss_mask: Tensor,
    silent: Tensor,
    scale: Tensor | None = None,
) -> Tensor:
    """The sequence advantages ``adv`` ``[N]`` on every generated token, each moved by how far
    its turn's return is from its sample's reward (over ``scale`` ``[N]``, the estimator's
    normalisation): ``A_t = adv_i + (G_t − r_i) / scale_i``. ``silent`` ``[N]`` marks samples
    that teach nothing (a group of one under ``single_sample: zero``): 0 on every token."""
    out = broadcast_to_tokens(adv, loss_mask)
    if token_returns is None:
        return out
    _check_tokens(loss_mask, token_returns)
    shift = token_returns.to(torch.float64) - _floating(rewards).to(torch.float64)[:, None]
    if scale is not None:
        shift = shift / scale.to(torch.float64)[:, None]
    moved = torch.where(loss_mask.bool() & ~silent[:, None], shift, 0.0)
    return (out.to(torch.float64) + moved).to(out.dtype)


def grpo_token_advantages(
    *,
    rewards: Tensor,
    group_ids: Tensor,
    loss_mask: Tensor,
    token_returns: Tensor | None = None,
    eps: float = 1e-6,
    normalize_std: bool = True,
    single_sample: str = "zero",
) -> Tensor:
    """``advantage/grpo``: :func:`grpo_advantages` (``eps``, ``normalize_std``,
    ``single_sample``), each token centred and scaled by its group's statistics of the samples'
    rewards but valued at its own turn's return: ``A_t = (G_t − mean_g) / (std_g + eps)``."""
    adv = grpo_advantages(
        rewards, group_ids, eps=eps, normalize_std=normalize_std, single_sample=single_sample
    )
    if token_returns is None:
        return broadcast_to_tokens(adv, loss_mask)
    size, _, sq_dev = _group_stats(rewards, group_ids)
    silent = (size == 1) & (single_sample == "zero")
    scale = None
    if normalize_std:
        std = torch.where(size == 1, 1.0, torch.sqrt(sq_dev / (size - 1).clamp(min=1)))
        scale = std + eps
    return _per_turn(adv, rewards, token_returns, loss_mask, silent, scale)


def rloo_token_advantages(
    *,
    rewards: Tensor,
    group_ids: Tensor,
    loss_mask: Tensor,
    token_returns: Tensor | None = None,
    single_sample: str = "zero",
) -> Tensor:
    """``advantage/rloo``: :func:`rloo_advantages` (``single_sample``), each token valued at its
    own turn's return: ``A_t = G_t − mean_{j≠i, j∈g} r_j``."""
    adv = rloo_advantages(rewards, group_ids, single_sample)
    if token_returns is None:
        return broadcast_to_tokens(adv, loss_mask)
    silent = (_group_stats(rewards, group_ids)[0] == 1) & (single_sample == "zero")
    return _per_turn(adv, rewards, token_returns, loss_mask, silent)


def turn_rewards_on_tokens(token_returns: Tensor, loss_mask: Tensor) -> Tensor:
    """Token rewards ``[N, T]`` whose undiscounted sum from any generated token on is that
    token's turn return: each generated token gets its return less the next generated token's
    (the sample's last one keeps its whole return). So the reward sits where a turn ends and its
    return changes, and GAE with γ = λ = 1 gives every token exactly its turn's return."""
    _check_tokens(loss_mask, token_returns)
    mask = loss_mask.bool()
    g = torch.where(mask, _floating(token_returns), 0.0)
    out = torch.zeros_like(g)
    following = torch.zeros(g.shape[0], dtype=g.dtype, device=g.device)
    for t in range(g.shape[1] - 1, -1, -1):
        m = mask[:, t]
        out[:, t] = torch.where(m, g[:, t] - following, 0.0)
        following = torch.where(m, g[:, t], following)
    return out


def gae_token_advantages(
    *,
    rewards: Tensor,
    group_ids: Tensor,
    loss_mask: Tensor,
    token_returns: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> Tensor:
    """``advantage/gae``: GAE without a critic over token rewards, each turn's reward where the
    turn ends (:func:`turn_rewards_on_tokens`; without ``token_returns``, the sequence reward on
    the last token). ``gamma`` and ``lam`` are per token and default to 1: the per-turn discount
    is already in the returns (``algorithm.discount``), and is never applied per token as well.

    ``group_ids`` is accepted for the common signature and unused: GAE needs no group.
    """
    del group_ids
    if token_returns is None:
        token_rewards = sequence_rewards_to_tokens(rewards, loss_mask)
    else:
        token_rewards = turn_rewards_on_tokens(token_returns, loss_mask)
    return gae_no_critic_advantages(token_rewards, loss_mask, gamma, lam)
