"""Pipeline parallelism with ``torch.distributed.pipelining``: stages split by layers.

The decoder's layers are split evenly into ``pp × stages_per_rank`` stages (earlier stages take
the remainder); the embedding belongs to stage 0, the final norm and the LM head to the last.
:func:`prune_to_stages` prunes the decoder in place to this rank's stages, keeping every module
under its original name (``model.layers.5``), so checkpoints of a pipelined model have the same
keys as any other. :func:`build_stages` then wraps each stage in a :class:`PipelineStageModule`,
the module a ``PipelineStage`` runs (built after activation checkpointing and compile, so it holds
the wrapped layers, and before FSDP, which makes each stage module a root of its own).

Schedules (:data:`SCHEDULES`): ``1F1B`` (default) and ``GPipe`` with one stage per rank;
``Interleaved1F1B`` and ``ZeroBubble`` (interleaved zero-bubble: backward split into input and
weight gradients, the weight part filling the bubble) with one or more stages per rank, assigned
round-robin (rank r holds stages r, r + pp, ...). The V-shaped ZBV schedule is left out: torch
cannot run it forward-only, which the proximal log-probs need.

A model that ties its LM head to its embedding keeps one copy on the first stage's ranks and one
on the last's (loaded from the same checkpoint tensor), as Megatron-LM does: after each backward
the two gradients are summed between those ranks (:func:`tied_group`), so both copies take the
same update; the gradient norm counts the pair once.

One microbatch is one pack; its positions, sample boundaries (``segments``), target ids and loss
mask (as each trained position's sampling temperature, 0 where nothing is trained) travel with
the hidden states from stage to stage. :class:`PipelineLayout` is the step's
layout under ``pp > 1``: the last stage's forward ends with the LM head and returns the trained
tokens' log-probs, and the RL loss runs on them there; the schedule's ``target`` carries only each
microbatch's index, and the loss function reads that pack's RL inputs from the step (loss kwargs
are not split per microbatch). The proximal log-probs come from a forward-only pass of the same
schedule (``eval``), as do the KL reference model's (a second pipelined model; only the last
stage's ranks add their KL). Each pack's loss is already divided by the minibatch's global token
count, so the schedule does not scale the gradients (``scale_grads=False``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from areal.core.run_config import SINGLE_STAGE_SCHEDULES
from areal.core.types import Sample
from areal.plugins.models.attention import AttentionBackend
from areal.plugins.models.decoder import DecoderForCausalLM
from areal.plugins.trainer.packed_attention import PackedCausalAttention
from areal.plugins.trainer.packing import PackedBatch
from areal.plugins.trainer.parallel.context_parallel import UlyssesAttention
from areal.plugins.trainer.parallel.layout import MeshLayout, append_padding, clip_grad_norm
from areal.plugins.trainer.parallel.parallel_dims import ParallelMesh
from areal.plugins.trainer.step import logprobs_from_hidden

# schedule -> how stages are placed on ranks
SCHEDULES = {
    "1F1B": "loop",
    "GPipe": "loop",
    "Interleaved1F1B": "loop",
    "ZeroBubble": "loop",
}
_SINGLE_STAGE = SINGLE_STAGE_SCHEDULES  # one list of them, the run config's (no torch there)

__all__ = [
    "SCHEDULES",
    "PipelineLayout",
    "PipelineStageModule",
    "StageSpec",
    "build_stages",
    "make_layout",
    "prune_to_stages",
    "split_stage",
    "stage_ids",
    "stage_layers",
    "stage_modules",
    "tied_group",
]

# The stage modules, and the schedule they were built for, of each pruned decoder.
_STAGES: weakref.WeakKeyDictionary[nn.Module, list[PipelineStageModule]] = (
    weakref.WeakKeyDictionary()
)
_SCHEDULE_OF: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()


def stage_layers(num_layers: int, stage: int, num_stages: int) -> range:
    """The decoder layers of ``stage``: an even split, the first stages taking the remainder."""
    base, extra = divmod(num_layers, num_stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (stage < extra))


def stage_ids(rank: int, pp: int, per_rank: int, style: str = "loop") -> list[int]:
    """The stages rank ``rank`` holds: round-robin (``loop``) or a V of two (``v``, for ZBV)."""
    if style == "v":
        return [rank, 2 * pp - 1 - rank]
    return [rank + k * pp for k in range(per_rank)]


def check_schedule(schedule: str, per_rank: int) -> None:
    """Raise an error naming the option when ``schedule`` cannot run ``per_rank`` stages."""
    if schedule not in SCHEDULES:
        raise ValueError(
            f"pipeline_schedule: {schedule!r} is unknown; use one of {', '.join(SCHEDULES)}"
        )
    if per_rank < 1:
        raise ValueError(f"pipeline_stages_per_rank: must be >= 1; got {per_rank}")
    if schedule in _SINGLE_STAGE and per_rank != 1:
        raise ValueError(
            f"pipeline_stages_per_rank: {schedule} runs one stage per rank; got {per_rank}; "
            "use Interleaved1F1B or ZeroBubble for more"
        )


@dataclass(frozen=True)
class StageSpec:
    index: int
    num_stages: int
    layers: tuple[int, ...]

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.num_stages - 1


def prune_to_stages(
    model: DecoderForCausalLM, rank: int, pp: int, per_rank: int = 1, style: str = "loop"
) -> list[StageSpec]:
    """Keep only this rank's stages' modules in ``model`` (in place); return their specs."""
    config = model.config
    num_stages = pp * per_rank
    if config.num_hidden_layers < num_stages:
        raise ValueError(
            f"train.parallelism.pp: {num_stages} stages but the model has only "
            f"{config.num_hidden_layers} layers; use pp × stages per rank <= "
            f"{config.num_hidden_layers}"
        )
    specs = [
        StageSpec(s, num_stages, tuple(stage_layers(config.num_hidden_layers, s, num_stages)))
        for s in sorted(stage_ids(rank, pp, per_rank, style))
    ]
    body = model.model
    keep = [i for spec in specs for i in spec.layers]
    body.layers = nn.ModuleDict({str(i): body.layers[i] for i in keep})  # type: ignore[assignment]
    if not any(spec.is_first for spec in specs):
        body.embed_tokens = None  # type: ignore[assignment]
    if not any(spec.is_last for spec in specs):
        body.norm = None  # type: ignore[assignment]
        model.lm_head = None  # type: ignore[assignment]
    return specs


class PipelineStageModule(nn.Module):
    """One pipeline stage of a decoder: ``(ids | hidden, positions, segments, targets, mask) ->``
    the same for the next stage, or, on the last, the log-probs of the trained tokens ``[1, N]``
    (the LM head runs inside the stage's forward, where FSDP has its weight gathered).

    Its children are the decoder's own modules of this stage (not the decoder), so FSDP can make
    each stage module a root that owns exactly its stage's weights.
    """

    def __init__(self, decoder: DecoderForCausalLM, spec: StageSpec) -> None:
        super().__init__()
        body = decoder.model
        self.spec = spec
        self.config = decoder.config
        self.embed_tokens = body.embed_tokens if spec.is_first else None
        layers: Any = body.layers  # a ModuleDict once pruned
        self.layers = nn.ModuleDict({str(i): layers[str(i)] for i in spec.layers})
        self.norm = body.norm if spec.is_last else None
        self.lm_head = decoder.lm_head if spec.is_last else None
        self.rotary_emb = body.rotary_emb
        self.tp = 1  # sequence-parallel TP: hidden states between stages are 1/tp of the tokens
        self.cp_group: dist.ProcessGroup | None = None  # context parallel: Ulysses attention
        # The dtype of the activations sent between stages (FSDP's param_dtype when it casts).
        self.compute_dtype = next(decoder.parameters()).dtype

    def example_args(self, length: int) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
        """Example inputs and outputs of one microbatch of ``length`` tokens (this cp rank's), so
        the stage needs no shape inference (which runs the forward, and on the last stage the
        loss, on uninitialised tensors)."""
        size = (1, length // self.tp, self.config.hidden_size)
        # requires_grad marks what carries a gradient between the stages (the hidden states).
        hidden = torch.empty(size, dtype=self.compute_dtype, requires_grad=True)
        cp = 1 if self.cp_group is None else dist.get_world_size(self.cp_group)
        long = torch.long
        # positions, segments (the whole pack's: attention needs every sample boundary), targets,
        # then the loss mask as each trained position's sampling temperature (0: not trained)
        ints = tuple(torch.zeros(1, n, dtype=long) for n in (length, length * cp, length))
        rest = (*ints, torch.zeros(1, length))
        first = torch.zeros(1, length, dtype=long) if self.spec.is_first else hidden
        last = (torch.empty(1, length, requires_grad=True),)
        return (first, *rest), last if self.spec.is_last else (hidden, *rest)

    def forward(
        self, x: Tensor, positions: Tensor, segments: Tensor, targets: Tensor, mask: Tensor
    ) -> Any:
        if self.embed_tokens is not None:
            x = self.embed_tokens(x)
        cos, sin = self.rotary_emb(positions, x.dtype)
        cu_seqlens = _cu_seqlens(segments[0])
        attention: AttentionBackend = (
            PackedCausalAttention(cu_seqlens)
            if self.cp_group is None
            else UlyssesAttention(cu_seqlens, self.cp_group)
        )
        for layer in self.layers.values():
            x = layer(x, cos, sin, attention)
        if self.norm is None or self.lm_head is None:
            return x, positions, segments, targets, mask
        hidden = self.norm(x)
        if isinstance(hidden, DTensor):  # sequence-parallel TP: gather the tokens
            hidden = hidden.full_tensor()
        # ``mask`` carries each trained position's sampling temperature (0: not trained).
        trained = mask[0] > 0
        temperatures = torch.where(trained, mask[0], 1.0)
        logprobs = logprobs_from_hidden(self.lm_head, hidden[0], targets[0], trained, temperatures)
        return logprobs[None]


def build_stages(
    model: DecoderForCausalLM,
    specs: Sequence[StageSpec],
    *,
    schedule: str = "1F1B",
    tp: int = 1,
    cp_group: dist.ProcessGroup | None = None,
) -> list[PipelineStageModule]:
    """The stage modules of a pruned decoder (registered for :class:`PipelineLayout`)."""
    stages = [PipelineStageModule(model, spec) for spec in specs]
    for stage in stages:
        stage.tp, stage.cp_group = tp, cp_group
    _STAGES[model] = stages
    _SCHEDULE_OF[model] = schedule
    return stages


def split_stage(model: DecoderForCausalLM, stage: int, num_stages: int) -> PipelineStageModule:
    """Prune ``model`` to ``stage`` of ``num_stages`` (one per rank) and return its module."""
    (module,) = build_stages(model, prune_to_stages(model, stage, num_stages))
    return module


def stage_modules(model: nn.Module) -> list[PipelineStageModule]:
    if model not in _STAGES:
        raise ValueError("this model was not split into pipeline stages (parallelize with pp > 1)")
    return _STAGES[model]


class PipelineLayout(MeshLayout):
    """The step on a mesh with ``pp > 1`` (combined with any of dp, tp, cp, ep); the schedule is
    the one the model was parallelized for."""

    def __init__(self, mesh: ParallelMesh) -> None:
        super().__init__(mesh)
        self.pp_size = mesh.dims.pp
        self.pp_rank = mesh["pp"].get_local_rank()
        self._pp_group = mesh["pp"].get_group()
        self._tied: dist.ProcessGroup | None = None  # made at the first tied model's backward
        self._copy: Tensor | None = None  # the last stage's copy of a tied embedding

    def packs(
        self, samples: Sequence[Sample], start: int, max_tokens: int | None
    ) -> list[PackedBatch]:
        """The dp share's packs, all padded to one length (microbatches are stacked), as many as
        a multiple of ``pp`` (what the schedules need; at least one per rank), then this cp
        rank's slice."""
        packs = self.dp_packs(samples, start, max_tokens)
        packs += [None] * (-len(packs) % self.pp_size)
        longest = max(p.n_tokens if p is not None else 1 for p in packs)
        length = -(-longest // self.multiple) * self.multiple
        return self.shard([_pad_to(p, length) for p in packs])

    def logprobs(self, model: DecoderForCausalLM, packs: Sequence[PackedBatch]) -> list[Tensor]:
        """Forward-only through the pipeline; the last stage has the log-probs (other ranks
        return zeros, which no loss reads)."""
        schedule = self._schedule(model, packs, loss_fn=None)
        logprobs = schedule.eval(*self._inputs(model, packs))
        if not _holds(model, last=True):
            return [torch.zeros(p.n_tokens) for p in packs]
        return list(logprobs.unbind(0))

    def holds_logprobs(self, model: DecoderForCausalLM) -> bool:
        return _holds(model, last=True)

    def forward_backward(
        self,
        model: DecoderForCausalLM,
        packs: Sequence[PackedBatch],
        pack_loss: Callable[[int, Tensor], Tensor],
    ) -> None:
        def loss_fn(output: Tensor, target: Tensor) -> Tensor:
            j = int(target.reshape(-1)[0])  # the target is only the microbatch's index
            return pack_loss(j, output[0])

        schedule = self._schedule(model, packs, loss_fn=loss_fn)
        target = torch.arange(len(packs))[:, None] if _holds(model, last=True) else None
        schedule.step(*self._inputs(model, packs), target=target)
        if model.config.tie_word_embeddings:
            self._sum_tied_grads(model)

    def clip_grad_norm(self, parameters: list[Tensor], max_norm: float) -> float:
        """The norm over every stage's gradients, a tied LM head's copy left out (it is the
        embedding's, counted on the first stage), but clipped like the rest."""
        copy = self._copy
        counted = [p for p in parameters if p is not copy]
        extra = [copy] if copy is not None and len(counted) < len(parameters) else []
        return clip_grad_norm(counted, max_norm, across=self._pp_group, also_clip=extra)

    def _sum_tied_grads(self, model: DecoderForCausalLM) -> None:
        """Sum the embedding's gradient (first stage) and the LM head's (last stage): the two
        copies of one tied matrix then take the same step. Every rank calls this."""
        if self._tied is None:
            self._tied = tied_group(self.mesh)
        body = model.model
        weight = body.embed_tokens.weight if body.embed_tokens is not None else None
        if model.lm_head is not None:
            weight = model.lm_head.weight
            self._copy = weight  # the last stage's copy: left out of the norm
        if weight is None:
            return  # a middle stage: not in the group
        grad = weight.grad
        if grad is None:  # no gradient reached it (nothing trained): the same on both ends
            return
        if isinstance(grad, DTensor):
            if isinstance(weight, DTensor) and grad.placements != weight.placements:
                # Under TP the embedding's gradient comes back replicated: shard it as the
                # weight is (a local slice), so both ends hold the same rows.
                grad = weight.grad = grad.redistribute(placements=weight.placements)
            grad = grad.to_local()
        dist.all_reduce(grad, group=self._tied)

    def all_reduce(self, tensor: Tensor) -> Tensor:
        """Sum over dp × cp and over the stages (only the last stage computed the loss)."""
        tensor = super().all_reduce(tensor)
        dist.all_reduce(tensor, group=self._pp_group)
        return tensor

    def _inputs(
        self, model: DecoderForCausalLM, packs: Sequence[PackedBatch]
    ) -> tuple[Tensor, ...]:
        if not _holds(model, last=False):
            return ()
        ids = torch.cat([p.input_ids for p in packs])
        positions = torch.cat([p.positions for p in packs])
        segments = torch.stack([_segments(p) for p in packs])
        targets = torch.stack([p.target_ids for p in packs])
        mask = torch.stack([torch.where(p.loss_mask, p.temperatures, 0.0) for p in packs])
        return ids, positions, segments, targets, mask

    def _schedule(
        self,
        model: DecoderForCausalLM,
        packs: Sequence[PackedBatch],
        loss_fn: Callable[..., Any] | None,
    ) -> Any:
        from torch.distributed import pipelining

        device = next(iter(model.parameters())).device
        stages: list[Any] = []
        for module in stage_modules(model):
            inputs, outputs = module.example_args(packs[0].n_tokens)
            stages.append(
                pipelining.PipelineStage(
                    module,
                    module.spec.index,
                    module.spec.num_stages,
                    device,
                    input_args=_on(inputs, device),
                    output_args=_on(outputs, device),
                    group=self._pp_group,
                )
            )
        name = _SCHEDULE_OF[model]
        options: dict[str, Any] = {"loss_fn": loss_fn, "scale_grads": False}
        if name in _SINGLE_STAGE:
            single = pipelining.Schedule1F1B if name == "1F1B" else pipelining.ScheduleGPipe
            return single(stages[0], len(packs), **options)
        multi = {
            "Interleaved1F1B": pipelining.ScheduleInterleaved1F1B,
            "ZeroBubble": pipelining.ScheduleInterleavedZeroBubble,
        }[name]
        return multi(stages, len(packs), **options)


def tied_group(mesh: ParallelMesh) -> dist.ProcessGroup | None:
    """The group of this rank's first and last pipeline stage (its dp, tp, cp coordinates
    fixed): where a tied embedding's two copies live. Every rank makes every such group (a
    collective); a middle stage's rank belongs to none (``None``)."""
    dense = mesh.dense
    pp_dim = list(dense.mesh_dim_names or ()).index("pp")
    rows = dense.mesh.movedim(pp_dim, -1).reshape(-1, mesh.dims.pp).tolist()
    mine = None
    for row in rows:
        group = dist.new_group([row[0], row[-1]])
        if dist.get_rank() in (row[0], row[-1]):
            mine = group
    return mine


def _holds(model: nn.Module, *, last: bool) -> bool:
    """Whether this rank holds the last (or the first) stage."""
    return any(m.spec.is_last if last else m.spec.is_first for m in stage_modules(model))


def _on(tensors: tuple[Tensor, ...], device: torch.device) -> tuple[Tensor, ...]:
    return tuple(t.detach().to(device).requires_grad_(t.requires_grad) for t in tensors)


def _segments(batch: PackedBatch) -> Tensor:
    """``[N]``: the index of each token's sample in the pack (attention never crosses them)."""
    lengths = batch.cu_seqlens[1:] - batch.cu_seqlens[:-1]
    return torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)


def _cu_seqlens(segments: Tensor) -> Tensor:
    _, counts = torch.unique_consecutive(segments, return_counts=True)
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)])


def _pad_to(batch: PackedBatch | None, length: int) -> PackedBatch:
    """``batch`` (or nothing) padded with one padding sample to exactly ``length`` tokens."""
    return append_padding(batch, length - (0 if batch is None else batch.n_tokens))


def make_layout(mesh: ParallelMesh) -> MeshLayout:
    """The step's layout for ``mesh``: a pipeline schedule when ``pp > 1`` (the one the model
    was parallelized for)."""
    if mesh.dims.pp_enabled:
        return PipelineLayout(mesh)
    return MeshLayout(mesh)
