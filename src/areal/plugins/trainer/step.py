"""One training step of asynchronous RL in a single process: the configured loss on packed samples.

The story of :func:`train_step`, top to bottom:

1. **Advantages** from the samples' rewards and their turns' returns, by the estimator named
   ``advantage`` (``advantage/<name>`` in the loss registry: GRPO, RLOO, GAE, turn, GiGPO), on
   the prediction-aligned loss mask (:mod:`~areal.plugins.trainer.turn_inputs`), optionally normalised over the batch's valid tokens (``advantage_norm: batch``), then
   looked up per packed token.
2. **Proximal log-probs** π_prox, the trust-region anchor: ``recompute`` runs the pre-update
   weights over every minibatch under ``no_grad`` *before the first update* (the step's minibatches
   each move the weights, so computing them later would anchor at the wrong policy);
   ``loglinear`` interpolates between the behaviour and current log-probs by the tokens' versions
   (AReaL's approximation), saving that forward pass; on the first minibatch, where no update has
   run, it takes π_θ itself, and ``loglinear_every_minibatch`` applies the formula there too
   (AReaL's behaviour).
3. For each **minibatch** of ``mini_batch_size`` samples: a packed forward, the loss named
   ``loss`` in the registry (decoupled PPO by default) with its ``loss_options``, averaged over
   the minibatch's valid tokens (or, for a ``seq-mean-*`` ``loss_agg_mode``, over its sequences
   that have one), backward, optional gradient clipping, one optimizer step.

Deviation from a textbook PPO epoch: one pass over the data (no repeated epochs), as AReaL runs it
by default; minibatches follow the order of ``samples``.

Across ranks (:mod:`areal.plugins.trainer.parallel`) the same story runs on every rank with the
whole step's ``samples``: a :class:`StepLayout` picks this rank's packs of each minibatch, the
attention backend, how packs go forward and backward (one by one, or a pipeline schedule), the
gradient-norm reduction and the sum of the statistics. Every rank knows every minibatch's
valid-token (and valid-sequence) count from ``samples``, so each pack's loss is weighted by its
share of the *global* count and the ranks' gradients only need summing (docs/training.md,
"Decoupled PPO": token-level averaging). A pack holds whole samples except under context
parallelism, which splits them over ranks: the per-sequence modes are refused there
(:func:`~areal.plugins.trainer.engine.check_loss`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from areal.core.loss_options import call_options, option_defaults
from areal.core.plugins import registry
from areal.core.registry import Registry
from areal.core.types import Sample
from areal.plugins.models.attention import AttentionBackend
from areal.plugins.models.decoder import DecoderForCausalLM
from areal.plugins.trainer.loss_probe import probe_loss
from areal.plugins.trainer.packed_attention import PackedCausalAttention
from areal.plugins.trainer.packing import PackedBatch, pack
from areal.plugins.trainer.turn_inputs import turn_inputs, wanted_turn_inputs

__all__ = [
    "ADVANTAGE_NORMS",
    "PROX_LOGP_METHODS",
    "SEQUENCE_AGG_MODES",
    "SingleProcess",
    "StepLayout",
    "aligned_loss_mask",
    "behave_log_ratio_sum",
    "logprobs_from_hidden",
    "loss_agg_mode",
    "reference_kl",
    "token_logprobs",
    "train_step",
]

PROX_LOGP_METHODS = ("recompute", "loglinear", "loglinear_every_minibatch")
ADVANTAGE_NORMS = ("none", "batch")
# The ``loss_agg_mode`` values (areal.plugins.losses.tokens.AGG_MODES, verl's names) whose loss is
# a mean over sequences: a pack's loss then weighs by its share of the minibatch's sequences that
# have a valid token, not of its valid tokens. Spelled here, as the trainer imports no loss module.
SEQUENCE_AGG_MODES = ("seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")

# Loss statistics the step always returns, averaged over valid tokens across minibatches (0.0
# when the loss does not report one); any other statistic a loss reports is averaged as well.
_TOKEN_STATS = (
    "clip_fraction",
    "ratio_mean",
    "behavior_weight_mean",
    "cap_masked_fraction",
    "approx_kl",
)


class StepLayout(Protocol):
    """How one train step spreads over ranks: the seam between the step and the parallel engine."""

    def packs(
        self, samples: Sequence[Sample], start: int, max_tokens: int | None
    ) -> list[PackedBatch]:
        """This rank's packs of one minibatch (``start`` = index of ``samples[0]`` in the step).

        Every rank of a data-parallel group must get the same number of packs (collectives run
        per forward), ``sample_index`` refers to the whole step's samples.
        """
        ...

    def attention(self, batch: PackedBatch) -> AttentionBackend:
        """The attention backend for one of :meth:`packs`' batches."""
        ...

    def clip_grad_norm(self, parameters: list[Tensor], max_norm: float) -> float:
        """Clip the gradients to ``max_norm`` by their global norm; return that norm."""
        ...

    def all_reduce(self, tensor: Tensor) -> Tensor:
        """Sum over the ranks that hold different tokens of the step (dp × cp)."""
        ...

    def logprobs(self, model: DecoderForCausalLM, packs: Sequence[PackedBatch]) -> list[Tensor]:
        """:func:`token_logprobs` of every pack (called under ``no_grad``)."""
        ...

    def holds_logprobs(self, model: DecoderForCausalLM) -> bool:
        """Whether :meth:`logprobs` computes them on this rank; a pipeline's other stages get
        placeholders (its last stage has the LM head), which nothing may sum."""
        ...

    def forward_backward(
        self,
        model: DecoderForCausalLM,
        packs: Sequence[PackedBatch],
        pack_loss: Callable[[int, Tensor], Tensor],
    ) -> None:
        """Forward each pack, ``pack_loss(j, logprobs)`` on it, backward (a pipeline runs these
        as its schedule says, the loss on the last stage)."""
        ...


class SingleProcess:
    """The whole step in this process: every sample, plain packed attention."""

    def packs(
        self, samples: Sequence[Sample], start: int, max_tokens: int | None
    ) -> list[PackedBatch]:
        packs = pack(list(samples), max_tokens)
        for p in packs:
            p.sample_index += start
        return packs

    def attention(self, batch: PackedBatch) -> AttentionBackend:
        return PackedCausalAttention(batch.cu_seqlens)

    def clip_grad_norm(self, parameters: list[Tensor], max_norm: float) -> float:
        return float(torch.nn.utils.clip_grad_norm_(parameters, max_norm))

    def all_reduce(self, tensor: Tensor) -> Tensor:
        return tensor

    def logprobs(self, model: DecoderForCausalLM, packs: Sequence[PackedBatch]) -> list[Tensor]:
        return [token_logprobs(model, p, self.attention(p)) for p in packs]

    def holds_logprobs(self, model: DecoderForCausalLM) -> bool:
        return True

    def forward_backward(
        self,
        model: DecoderForCausalLM,
        packs: Sequence[PackedBatch],
        pack_loss: Callable[[int, Tensor], Tensor],
    ) -> None:
        for j, p in enumerate(packs):
            pack_loss(j, token_logprobs(model, p, self.attention(p))).backward()


def token_logprobs(
    model: DecoderForCausalLM, batch: PackedBatch, attention: AttentionBackend | None = None
) -> Tensor:
    """log π(target token) at every packed position that is trained on, ``[N]`` float32.

    One forward pass through the decoder body, then the LM head and ``log_softmax`` only at the
    positions of ``batch.loss_mask``: in an agent's samples most tokens are prompt and tool
    output, and the ``[N, vocab]`` logits of those would dominate the step's time and memory for
    nothing. Other positions hold 0 (the loss mask hides them). Logits are cast to fp32 before
    ``log_softmax``: in bf16 the log-probs of likely tokens round to steps of ~0.01, which is the
    size of the ratios PPO clips.
    """
    if attention is None:
        attention = PackedCausalAttention(batch.cu_seqlens)
    hidden = model.hidden_states(batch.input_ids, batch.positions, attention)[0]  # [N, H]
    return logprobs_from_hidden(
        model.lm_head, hidden, batch.target_ids, batch.loss_mask, batch.temperatures
    )


def logprobs_from_hidden(
    lm_head: torch.nn.Module,
    hidden: Tensor,
    target_ids: Tensor,
    loss_mask: Tensor,
    temperatures: Tensor | None = None,
) -> Tensor:
    """The LM head and ``log_softmax`` of :func:`token_logprobs` on final hidden states ``[N, H]``
    (a pipeline's last stage has these without the rest of the model).

    ``temperatures`` ``[N]``: each position's logits are divided by the temperature its target was
    sampled at, as the engine did, so the policy trained is the policy that sampled (the engine
    reports the log-probs of that temperature's softmax over the whole vocabulary; top-p, top-k,
    min-p and grammars only chose which token was drawn, docs/training.md).
    """
    index = loss_mask.nonzero().squeeze(-1)
    logits = lm_head(hidden[index]).float()  # [M, V], M = trained positions
    scale = None if temperatures is None else temperatures[index].float()
    if hasattr(logits, "device_mesh"):  # a DTensor: vocab-sharded logits (loss-parallel, TP)
        from areal.plugins.trainer.parallel.loss_parallel import vocab_parallel_logprobs

        picked = vocab_parallel_logprobs(logits, target_ids[index], scale)
    else:
        if scale is not None:
            logits = logits / scale[:, None]
        picked = torch.log_softmax(logits, dim=-1).gather(-1, target_ids[index, None])
        picked = picked.squeeze(-1)
    out = torch.zeros(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    return out.index_put((index,), picked)


def loss_agg_mode(loss_fn: Callable[..., Any], options: dict[str, Any]) -> str:
    """The ``loss_agg_mode`` ``loss_fn`` runs with: the option given, else its signature's
    default, else ``token-mean`` (a loss without the option is a mean over valid tokens, the
    contract of docs/training.md, "The loss signature")."""
    if "loss_agg_mode" in options:
        return str(options["loss_agg_mode"])
    default = (option_defaults(loss_fn) or {}).get("loss_agg_mode", "token-mean")
    return default if isinstance(default, str) else "token-mean"


def _loss_share(batch: PackedBatch, per_sequence: bool) -> int:
    """What ``batch`` adds to its minibatch's loss denominator: its valid tokens, or with
    ``per_sequence`` its samples that have one (a pack holds whole samples, and padding samples
    have none)."""
    if per_sequence:
        return int(batch.sample_index[batch.loss_mask].unique().numel())
    return int(batch.loss_mask.sum())


def aligned_loss_mask(samples: Sequence[Sample]) -> Tensor:
    """``[N, T]`` (T = longest sample) bool: column t is 1 when token t+1 is trained on.

    The advantage estimators' token layout, aligned the same way as :class:`PackedBatch`, so a
    packed token at position t of sample i reads its advantage at ``[i, t]``.
    """
    width = max(len(s.input_ids) for s in samples)
    mask = torch.zeros(len(samples), width, dtype=torch.bool)
    for i, s in enumerate(samples):
        if len(s.loss_mask) > 1:
            mask[i, : len(s.loss_mask) - 1] = torch.from_numpy(s.loss_mask[1:] != 0)
    return mask


def train_step(
    model: DecoderForCausalLM,
    optimizer: torch.optim.Optimizer,
    samples: Sequence[Sample],
    *,
    mini_batch_size: int,
    group_ids: Sequence[int],
    current_version: int,
    eps_clip: float = 0.2,
    eps_clip_high: float | None = None,
    behavior_weight_cap: float | None = None,
    loss: str = "decoupled_ppo",
    loss_options: dict[str, Any] | None = None,
    advantage: str = "grpo",
    advantage_options: dict[str, Any] | None = None,
    advantage_norm: str = "none",
    prox_logp: str = "recompute",
    max_grad_norm: float | None = None,
    max_tokens: int | None = None,
    losses: Registry[Any] | None = None,
    kl_coef: float = 0.0,
    reference: DecoderForCausalLM | None = None,
    layout: StepLayout | None = None,
) -> dict[str, float]:
    """Train ``model`` on ``samples`` (one RL step) and return the step's averaged statistics.

    ``group_ids`` (one per sample) say which samples answer the same task. ``current_version`` is
    the version of the weights this step starts from (the trainer's version; tokens generated by
    these very weights carry it), so the update produces ``current_version + 1``. ``max_tokens``
    caps a pack: a minibatch that does not fit is run as several packs whose gradients accumulate,
    weighted so the loss is still the minibatch's: the mean over all its valid tokens, or for a
    :data:`SEQUENCE_AGG_MODES` ``loss_agg_mode`` the mean over all its sequences that have a valid
    token (verl's ``agg_loss`` over the whole minibatch). ``losses`` is the
    loss registry (default: the process-wide one); ``loss`` names the loss in it, called with
    ``loss_options`` and, where it names them, ``eps_clip``, ``eps_clip_high`` and
    ``behavior_weight_cap`` (:func:`~areal.core.loss_options.call_options`). With ``kl_coef > 0`` each sample's reward is
    lowered by ``kl_coef ×`` its KL to ``reference`` (:func:`reference_kl`) before the advantages.

    Returns ``loss``, ``grad_norm`` (before clipping), ``n_tokens`` (packed), ``n_valid_tokens``,
    ``n_minibatches``, and the loss statistics averaged over valid tokens: those of
    ``_TOKEN_STATS`` always (0.0 if the loss lacks one), plus any other the loss reports, and
    ``behave_approx_kl`` (:func:`behave_log_ratio_sum`). ``loss`` is the minibatches' losses
    averaged with their valid tokens as weights: with ``token-mean`` that is the loss per valid
    token over the whole step; with a per-sequence mode each minibatch's term is its
    sequence mean. ``prox_logp`` is one of :data:`PROX_LOGP_METHODS`. ``layout`` spreads the
    step over ranks (default :class:`SingleProcess`); every rank passes the same ``samples``.
    """
    if not samples:
        raise ValueError("train_step needs at least one sample")
    if len(group_ids) != len(samples):
        raise ValueError(f"{len(samples)} samples but {len(group_ids)} group ids")
    if mini_batch_size < 1:
        raise ValueError(f"mini_batch_size must be >= 1; got {mini_batch_size}")
    if prox_logp not in PROX_LOGP_METHODS:
        raise ValueError(f"prox_logp must be one of {PROX_LOGP_METHODS}; got {prox_logp!r}")
    if advantage_norm not in ADVANTAGE_NORMS:
        raise ValueError(f"advantage_norm must be one of {ADVANTAGE_NORMS}; got {advantage_norm!r}")
    losses = losses if losses is not None else registry("losses")
    # Resolved once per step: the hot loop calls the real functions, not the lazy stand-ins.
    loss_fn = _resolve(losses.get(loss, key="loss"))
    typed = {
        "eps_clip": eps_clip,
        "eps_clip_high": eps_clip_high,
        "behavior_weight_cap": behavior_weight_cap,
    }
    options = call_options(loss_fn, loss=loss, options=loss_options, typed=typed)
    # Every rank sums the same statistics, also a pipeline stage that never runs the loss.
    token_stats = [*_TOKEN_STATS]
    token_stats += [n for n in probe_loss(loss_fn, options, loss=loss) if n not in _TOKEN_STATS]
    advantage_fn = _resolve(losses.get(f"advantage/{advantage}", key="advantage"))
    loglinear = prox_logp in ("loglinear", "loglinear_every_minibatch")
    approx_prox = _resolve(losses.get("proximal/loglinear")) if loglinear else None
    per_sequence = loss_agg_mode(loss_fn, options) in SEQUENCE_AGG_MODES
    layout = layout if layout is not None else SingleProcess()
    device = next(model.parameters()).device

    # Minibatches by samples; each becomes this rank's packs (sample_index made global). The
    # token and sequence counts come from the samples themselves, so every rank knows the global
    # ones. A pack's loss weighs share / total: its part of the minibatch's loss denominator
    # (valid tokens, or with a per-sequence mode the sequences that have one) over the whole.
    loss_mask = aligned_loss_mask(samples)  # [N, T]: also each minibatch's valid-token count
    minibatches: list[list[PackedBatch]] = []
    mb_tokens: list[int] = []
    mb_valid_tokens: list[int] = []
    pack_weights: list[list[float]] = []
    for start in range(0, len(samples), mini_batch_size):
        chunk = samples[start : start + mini_batch_size]
        packs = layout.packs(chunk, start, max_tokens)
        minibatches.append([p.to(device) for p in packs])
        mb_tokens.append(sum(len(s.input_ids) for s in chunk))
        mb_mask = loss_mask[start : start + mini_batch_size]
        mb_valid_tokens.append(int(mb_mask.sum()))
        total = int(mb_mask.any(dim=1).sum()) if per_sequence else mb_valid_tokens[-1]
        pack_weights.append([_loss_share(p, per_sequence) / max(total, 1) for p in packs])

    # 1. Advantages, [N, T] in the prediction-aligned layout, from the rewards less the optional
    # KL-to-reference penalty.
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    kl_ref = torch.zeros(len(samples))
    if kl_coef:
        if reference is None:
            raise ValueError("kl_coef > 0 needs the reference model")
        kl_ref = reference_kl(reference, minibatches, len(samples), layout).cpu()
        rewards = rewards - kl_coef * kl_ref
    # Estimators that credit turns also get each token's turn and return (turn_inputs).
    extra = turn_inputs(
        samples,
        group_ids,
        wanted_turn_inputs(advantage_fn),
        width=loss_mask.shape[1],
        return_shift=-kl_coef * kl_ref if kl_coef else None,
    )
    token_adv = advantage_fn(
        rewards=rewards,
        group_ids=torch.tensor(list(group_ids), dtype=torch.long),
        loss_mask=loss_mask,
        **extra,
        **(advantage_options or {}),
    )
    if advantage_norm != "none":
        normalize = _resolve(losses.get(f"advantage_norm/{advantage_norm}", key="advantage_norm"))
        token_adv = normalize(token_adv, loss_mask)
    token_adv = token_adv.to(device=device, dtype=torch.float32)

    # 2. Proximal log-probs with the pre-update weights, before any optimizer step.
    prox: list[list[Tensor]] = []
    if prox_logp == "recompute":
        with torch.no_grad():
            prox = [layout.logprobs(model, packs) for packs in minibatches]

    # 3. One optimizer step per minibatch.
    totals: dict[str, float] = dict.fromkeys(("loss", "behave_approx_kl", *token_stats), 0.0)

    def pack_loss(m: int, records: dict[int, dict[str, float]], j: int, logp: Tensor) -> Tensor:
        """Pack j of minibatch m: its loss, weighted to the minibatch's mean (the pack's loss
        is a mean over its own valid tokens, or sequences). Its statistics go to ``records[j]``,
        overwritten if a pipeline schedule evaluates the loss twice."""
        p = minibatches[m][j]
        if approx_prox is None:
            prox_p = prox[m][j]
        else:
            # v_θ is the version this update produces: the step's weights are v_θ − 1.
            prox_p = approx_prox(
                behavior_logprobs=p.behavior_logprobs,
                logprobs=logp.detach(),
                versions=p.versions,
                current_version=current_version + 1,
                # Before the first update π_θ is π_prox itself, which `loglinear` takes as is.
                weights_moved=m > 0 or prox_logp == "loglinear_every_minibatch",
            )
        value, stats = loss_fn(
            logprobs=logp,
            proximal_logprobs=prox_p,
            behavior_logprobs=p.behavior_logprobs,
            advantages=token_adv[p.sample_index, p.positions[0]],
            loss_mask=p.loss_mask,
            cu_seqlens=p.cu_seqlens,
            **options,
        )
        pack_valid = int(stats["n_valid_tokens"])
        weighted = value * pack_weights[m][j]  # this pack's term of the minibatch's loss
        records[j] = {
            # Σ over packs and ranks: the minibatch's loss × its valid tokens (see Returns).
            "loss": float(weighted.detach()) * mb_valid_tokens[m],
            "behave_approx_kl": behave_log_ratio_sum(prox_p, p.behavior_logprobs, p.loss_mask),
        }
        records[j].update({k: stats[k] * pack_valid for k in token_stats if k in stats})
        return weighted

    grad_norms: list[float] = []
    n_tokens = n_valid = 0
    for m, packs in enumerate(minibatches):
        mb_valid = mb_valid_tokens[m]  # global: the loss is a mean over all ranks' valid tokens
        n_tokens += mb_tokens[m]
        if mb_valid == 0:
            continue  # nothing to learn from; an AdamW step would still apply weight decay
        optimizer.zero_grad(set_to_none=True)
        records: dict[int, dict[str, float]] = {}
        layout.forward_backward(model, packs, functools.partial(pack_loss, m, records))
        for record in records.values():
            for name, value in record.items():
                totals[name] += value
        limit = max_grad_norm if max_grad_norm is not None else float("inf")
        grad_norms.append(layout.clip_grad_norm(list(model.parameters()), limit))
        optimizer.step()
        n_valid += mb_valid
    optimizer.zero_grad(set_to_none=True)

    # Sync point: each rank summed its own tokens' statistics; one all-reduce makes them global.
    names = list(totals)
    summed = layout.all_reduce(torch.tensor([totals[k] for k in names], dtype=torch.float64))
    totals = dict(zip(names, summed.tolist(), strict=True))
    denom = max(n_valid, 1)
    result = {name: value / denom for name, value in totals.items()}
    result["grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else 0.0
    result["n_tokens"] = float(n_tokens)
    result["n_valid_tokens"] = float(n_valid)
    result["n_minibatches"] = float(len(grad_norms))
    result["kl_ref"] = float(kl_ref.sum()) / denom  # per trained token
    return result


def behave_log_ratio_sum(proximal: Tensor, behavior: Tensor, loss_mask: Tensor) -> float:
    """Σ over trained tokens of log π_prox − log π_behav: the step's ``behave_approx_kl`` (AReaL's
    name) once divided by the tokens. On a run's first step π_prox is the policy that sampled, so
    it is ≈ 0 unless the trainer and the engine disagree on the distribution (temperature,
    truncation, numerics); later it measures how far off-policy the step's tokens are."""
    diff = torch.where(loss_mask, proximal.detach() - behavior, 0.0)
    return float(diff.sum())


def reference_kl(
    reference: DecoderForCausalLM,
    minibatches: Sequence[Sequence[PackedBatch]],
    n_samples: int,
    layout: StepLayout | None = None,
) -> Tensor:
    """``[n_samples]``: Σ over each sample's generated tokens of log π_behav − log π_ref, the k1
    estimate of KL(π ‖ π_ref) along the sampled sequence (the rollout's own log-probs stand for
    π, as in AReaL and InstructGPT). Under a ``layout`` each rank adds its own tokens, then the
    sums are all-reduced; in a pipeline only the last stage's ranks have log-probs to add."""
    layout = layout if layout is not None else SingleProcess()
    total = torch.zeros(n_samples, dtype=torch.float32)
    adds = layout.holds_logprobs(reference)
    with torch.no_grad():
        for packs in minibatches:
            computed = layout.logprobs(reference, packs)  # every rank: a pipeline's schedule
            if not adds:
                continue
            for p, ref in zip(packs, computed, strict=True):
                diff = torch.where(p.loss_mask, p.behavior_logprobs - ref, 0.0)
                total.index_add_(0, p.sample_index.cpu(), diff.cpu())
    return layout.all_reduce(total)


def _resolve(entry: Any) -> Any:
    """A registry entry's real function (the built-ins register lazy stand-ins with ``load``)."""
    load = getattr(entry, "load", None)
    return load() if callable(load) else entry
