"""Parallelism applied to the plain decoder from outside, in torchtitan's fixed order.

``parallelize(model, mesh, options)`` looks the model's family up in :data:`PARALLELIZERS` (one
``parallelize_<family>`` per family; Llama, Qwen2, Qwen3 and Qwen3-MoE share one decoder, so they
share :func:`parallelize_decoder`) and applies, in this order:

0. **PP** first, when ``pp > 1``: the decoder is pruned to this rank's stages
   (:mod:`.pipeline`), and everything below applies to what is left; the stage modules are
   built after compile (they hold the wrapped layers) and before FSDP (each becomes a root);
1. **TP** with sequence parallelism: q/k/v and gate/up column-wise, o/down row-wise (their
   outputs reduce-scattered back to sequence shards), the RMSNorms on sequence shards, the
   embedding row-wise (vocab-sharded), the LM head column-wise with the logits gathered (it runs
   only on trained positions, so a loss-parallel softmax would save little here);
2. **EP**: routed experts sharded over the ``ep`` ranks, tokens dispatched to them and back by
   all-to-all (:mod:`.expert_parallel`);
3. **CP**: no module changes, checked here; the step's layout shards every pack's tokens over
   the ``cp`` ranks and attends through :class:`~.context_parallel.UlyssesAttention`;
4. **activation checkpointing** of whole decoder layers (recompute in backward);
5. **compile** of each layer (``torch.compile``; GPU runs, off on CPU tests);
6. **FSDP2** ``fully_shard`` of each layer, then of the root (embedding, final norm, LM head), over
   ``dp_shard × cp`` (2-D with ``dp_replicate``: HSDP), with a mixed-precision policy.

The order matters: TP turns weights into DTensors on the ``tp`` mesh first, so FSDP shards them
again along ``dp`` (2-D DTensors); checkpointing and compile wrap modules FSDP will then shard.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from areal.plugins.models.decoder import DecoderForCausalLM, DecoderLayer
from areal.plugins.models.layers import MLP, MoE
from areal.plugins.trainer.parallel.expert_parallel import apply_ep
from areal.plugins.trainer.parallel.parallel_dims import ParallelMesh
from areal.plugins.trainer.parallel.pipeline import (
    SCHEDULES,
    build_stages,
    check_schedule,
    prune_to_stages,
)

__all__ = [
    "PARALLELIZERS",
    "ParallelizeOptions",
    "apply_activation_checkpointing",
    "apply_compile",
    "apply_fsdp",
    "apply_tp",
    "check_cp",
    "parallelize",
    "parallelize_decoder",
]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ParallelizeOptions:
    """What to apply besides the mesh's parallel sizes.

    ``param_dtype``/``reduce_dtype`` are FSDP2's mixed-precision policy (compute in
    ``param_dtype``, reduce gradients in ``reduce_dtype``; the sharded master weights stay in
    the model's own dtype): ``bfloat16``/``float32`` on GPUs, ``float32`` on CPU.
    ``pipeline_schedule`` and ``pipeline_stages_per_rank`` apply with ``pp > 1`` (see
    :mod:`.pipeline`).
    """

    activation_checkpointing: bool = False
    compile: bool = False
    param_dtype: str = "float32"
    reduce_dtype: str = "float32"
    reshard_after_forward: bool = True
    pipeline_schedule: str = "1F1B"
    pipeline_stages_per_rank: int = 1

    @classmethod
    def from_config(cls, train: Any) -> ParallelizeOptions:
        """From a run config's ``train`` section (:class:`~areal.core.run_config.TrainConfig`);
        a KL reference model gets the same, since its pipeline must be the policy's."""
        par = train.parallelism
        return cls(
            activation_checkpointing=train.activation_checkpointing,
            compile=train.compile,
            param_dtype=train.param_dtype,
            reduce_dtype=train.reduce_dtype,
            pipeline_schedule=par.pipeline_schedule,
            pipeline_stages_per_rank=par.pipeline_stages_per_rank,
        )


Parallelizer = Callable[[DecoderForCausalLM, ParallelMesh, ParallelizeOptions], DecoderForCausalLM]


def apply_tp(model: DecoderForCausalLM, tp_mesh: DeviceMesh) -> None:
    """Megatron-style TP with sequence parallelism; packs must hold a multiple of ``tp`` tokens."""
    config, tp = model.config, tp_mesh.size()
    for key, heads in (
        ("num_attention_heads", config.num_attention_heads),
        ("num_key_value_heads", config.num_key_value_heads),
    ):
        if heads % tp:
            raise ValueError(
                f"train.parallelism.tp: {tp} does not divide the model's {key} {heads} "
                "(each TP rank takes whole heads); use a divisor of it"
            )
    if config.vocab_size % tp:
        raise ValueError(
            f"train.parallelism.tp: {tp} does not divide vocab_size {config.vocab_size}; "
            "use a divisor of it"
        )
    tied = config.tie_word_embeddings
    body = model.model
    top: dict[str, Any] = {}  # a pipeline stage may lack the embedding or the norm and head
    if body.embed_tokens is not None:
        top["model.embed_tokens"] = RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(1)
        )
    if body.norm is not None:
        top["model.norm"] = SequenceParallel()
        # The body's output is gathered: the LM head reads rows at trained positions only.
        top["model"] = PrepareModuleOutput(
            output_layouts=Shard(1), desired_output_layouts=Replicate()
        )
    if model.lm_head is not None:
        # Loss-parallel: the logits stay sharded along the vocabulary; log_softmax and the
        # target's pick run on the shards (step.logprobs_from_hidden), so no rank ever holds
        # the [tokens, vocab] logits whole.
        top["lm_head"] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    parallelize_module(model, tp_mesh, top)
    if tied and body.embed_tokens is not None and model.lm_head is not None:
        # Both shard the [vocab, hidden] matrix along vocab (Shard(0)), so they stay one tensor.
        # (Pipeline stages hold one each: their gradients are summed, see pipeline.py.)
        model.lm_head.weight = body.embed_tokens.weight
    for _, layer in _layer_items(model):
        if not isinstance(layer, DecoderLayer):
            raise TypeError("apply_tp must run before activation checkpointing and compile")
        if isinstance(layer.mlp, MoE):
            raise ValueError(
                "train.parallelism.tp: tensor parallelism of routed experts is not supported yet; "
                "use tp: 1 for qwen3_moe models"
            )
        plan: dict[str, Any] = {
            "input_layernorm": SequenceParallel(),
            "self_attn": PrepareModuleInput(
                input_layouts=(Shard(1), None, None, None),
                desired_input_layouts=(Replicate(), None, None, None),
            ),
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            "post_attention_layernorm": SequenceParallel(),
        }
        if hasattr(layer.self_attn, "q_norm"):
            # Per-head norms over this rank's heads: the head dim (2) plays the sharded dim.
            plan["self_attn.q_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
            plan["self_attn.k_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        if isinstance(layer.mlp, MLP):
            plan["mlp"] = PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
            )
            plan["mlp.gate_proj"] = ColwiseParallel()
            plan["mlp.up_proj"] = ColwiseParallel()
            plan["mlp.down_proj"] = RowwiseParallel(output_layouts=Shard(1))
        parallelize_module(layer, tp_mesh, plan)


def check_cp(model: DecoderForCausalLM, cp: int, tp: int) -> None:
    """CP changes no module (the step's layout shards the packs and swaps the attention backend
    for :class:`~.context_parallel.UlyssesAttention`); it only needs whole heads per rank."""
    heads = model.config.num_attention_heads
    if heads % (tp * cp):
        raise ValueError(
            f"train.parallelism.cp: tp×cp = {tp}×{cp} does not divide num_attention_heads "
            f"{heads} (Ulysses attention gives each rank whole heads); lower cp or tp"
        )


def apply_activation_checkpointing(model: DecoderForCausalLM) -> None:
    """Recompute each decoder layer in backward: activation memory of one layer, not all."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    layers = model.model.layers
    for key, layer in _layer_items(model):
        layers[key] = checkpoint_wrapper(layer, preserve_rng_state=False)  # type: ignore[index]


def apply_compile(model: DecoderForCausalLM) -> None:
    """Compile each layer in place (same parameter names); layers share one compiled graph."""
    for _, layer in _layer_items(model):
        layer.compile(fullgraph=False)


def apply_fsdp(
    model: DecoderForCausalLM,
    mesh: DeviceMesh,
    options: ParallelizeOptions,
    expert_mesh: DeviceMesh | None = None,
    roots: Sequence[nn.Module] | None = None,
) -> None:
    """FSDP2: each layer is one all-gather unit, the root holds embedding, norm and LM head.

    With expert parallelism (``expert_mesh``) each layer's experts are a unit of their own,
    sharded over the ranks EP leaves (their weights are already split over ``ep``). ``roots``:
    the modules whose forwards run the rest (pipeline stage modules; default ``model``).

    Gradients are *summed* over the mesh, not averaged: the step's loss on each rank is already
    its tokens' share of the global token mean (see ``step.py``).
    """
    from torch.distributed.fsdp import (
        FSDPModule,
        MixedPrecisionPolicy,
        fully_shard,
        register_fsdp_forward_method,
    )

    for key in ("param_dtype", "reduce_dtype"):
        if getattr(options, key) not in _DTYPES:
            raise ValueError(f"{key}: unknown dtype {getattr(options, key)!r}; use {list(_DTYPES)}")
    policy = MixedPrecisionPolicy(
        param_dtype=_DTYPES[options.param_dtype], reduce_dtype=_DTYPES[options.reduce_dtype]
    )
    layers = [layer for _, layer in _layer_items(model)]
    for i, layer in enumerate(layers):
        # The last layer's parameters are needed again at once by backward: keep them gathered.
        reshard = options.reshard_after_forward and i < len(layers) - 1
        experts = getattr(getattr(layer, "mlp", None), "experts", None)
        if expert_mesh is not None and experts is not None:
            fully_shard(experts, mesh=expert_mesh, mp_policy=policy, reshard_after_forward=reshard)
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
    # The root stays gathered after forward: the step calls the LM head (tied to the embedding)
    # by itself after ``hidden_states``, outside any FSDP forward.
    for root in roots or [model]:
        fully_shard(root, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    if roots is None:
        register_fsdp_forward_method(model, "hidden_states")
    for module in [m for root in roots or [model] for m in root.modules()]:
        if isinstance(module, FSDPModule):
            # Plain SUM collectives: gloo has neither AVG nor PREMUL_SUM, and a factor of 1 needs
            # no division anyway.
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)


def parallelize_decoder(
    model: DecoderForCausalLM, mesh: ParallelMesh, options: ParallelizeOptions
) -> DecoderForCausalLM:
    """PP → TP → EP → CP → activation checkpointing → compile → FSDP2, on the decoder in place
    (under PP the decoder is pruned to this rank's stage)."""
    dims = mesh.dims
    if dims.cp_enabled:
        check_cp(model, dims.cp, dims.tp)
    specs = []
    if dims.pp_enabled:
        schedule, per_rank = options.pipeline_schedule, options.pipeline_stages_per_rank
        check_schedule(schedule, per_rank)
        pp_rank = mesh["pp"].get_local_rank()
        specs = prune_to_stages(model, pp_rank, dims.pp, per_rank, SCHEDULES[schedule])
    if dims.tp_enabled:
        apply_tp(model, mesh["tp"])
    if dims.ep_enabled:
        if not any(isinstance(m, MoE) for m in model.modules()):
            raise ValueError(
                "train.parallelism.ep: the model has no routed experts; use ep: 1 for dense models"
            )
        apply_ep(model, mesh["ep"])
    if options.activation_checkpointing:
        apply_activation_checkpointing(model)
    if options.compile:
        apply_compile(model)
    stages = []
    if specs:
        cp_group = mesh["cp"].get_group() if dims.cp_enabled else None
        schedule = options.pipeline_schedule
        stages = build_stages(model, specs, schedule=schedule, tp=dims.tp, cp_group=cp_group)
    if dims.fsdp_enabled or dims.hsdp_enabled:
        experts = mesh.expert_fsdp if dims.ep_enabled else None
        apply_fsdp(model, mesh.fsdp, options, expert_mesh=experts, roots=stages or None)
        for stage in stages:
            stage.compute_dtype = _DTYPES[options.param_dtype]
    return model


def _layer_items(model: DecoderForCausalLM) -> list[tuple[int | str, nn.Module]]:
    """The decoder layers with their keys (a ModuleList's indices, or a pipeline stage's
    ModuleDict names)."""
    layers = model.model.layers
    if isinstance(layers, nn.ModuleDict):
        return list(layers.items())
    return list(enumerate(layers))


PARALLELIZERS: dict[str, Parallelizer] = {
    "llama": parallelize_decoder,
    "qwen2": parallelize_decoder,
    "qwen3": parallelize_decoder,
    "qwen3_moe": parallelize_decoder,
}


def parallelize(
    model: nn.Module, mesh: ParallelMesh, options: ParallelizeOptions | None = None
) -> DecoderForCausalLM:
    """Apply the parallelizer registered for ``model``'s family."""
    if not isinstance(model, DecoderForCausalLM):
        raise TypeError(f"parallelize expects a DecoderForCausalLM; got {type(model).__name__}")
    family = model.family or model.config.model_type
    if family not in PARALLELIZERS:
        raise ValueError(
            f"no parallelizer for model family {family!r}; known: {sorted(PARALLELIZERS)}"
        )
    return PARALLELIZERS[family](model, mesh, options or ParallelizeOptions())
