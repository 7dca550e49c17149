"""The RL train step over a ParallelMesh: which packs this rank runs, gradient norms across ranks.

:class:`MeshLayout` is the :class:`~areal.plugins.trainer.step.StepLayout` of the 5D engine. Every
rank is handed the whole step's samples (advantages are normalised over task groups that may span
ranks, and the global valid-token counts come for free); each minibatch's samples are split over
the ``dp`` ranks, balanced by tokens, and each pack's tokens over the ``cp`` ranks. Data-parallel ranks must run the same number of forward and
backward passes, since FSDP all-gathers per pass, so a rank with fewer packs gets empty ones, and
with TP (sequence parallel) every pack is padded to a multiple of ``tp`` tokens. Padding tokens
are a sample of their own with nothing to train on, so they change no loss and no gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor

from areal.core.types import Sample
from areal.plugins.models.attention import AttentionBackend
from areal.plugins.models.decoder import DecoderForCausalLM
from areal.plugins.trainer.packed_attention import PackedCausalAttention
from areal.plugins.trainer.packing import PackedBatch, pack
from areal.plugins.trainer.parallel.context_parallel import UlyssesAttention, shard_sequence
from areal.plugins.trainer.parallel.parallel_dims import ParallelMesh
from areal.plugins.trainer.step import SingleProcess, token_logprobs

__all__ = [
    "MeshLayout",
    "append_padding",
    "clip_grad_norm",
    "pad_pack",
    "split_by_tokens",
]


def split_by_tokens(lengths: Sequence[int], n_ranks: int) -> list[list[int]]:
    """Indices of ``lengths`` for each rank: longest first to the least-loaded rank, then each
    rank's indices in their original order. Deterministic, so every rank computes every share."""
    shares: list[list[int]] = [[] for _ in range(n_ranks)]
    load = [0] * n_ranks
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        r = min(range(n_ranks), key=lambda r: (load[r], r))
        shares[r].append(i)
        load[r] += lengths[i]
    return [sorted(s) for s in shares]


def pad_pack(batch: PackedBatch | None, multiple: int) -> PackedBatch:
    """``batch`` padded to a multiple of ``multiple`` tokens (``None``: an empty pack of
    ``multiple`` padding tokens)."""
    n = 0 if batch is None else batch.n_tokens
    pad = (-n) % multiple if n else multiple
    return append_padding(batch, pad)


def append_padding(batch: PackedBatch | None, count: int) -> PackedBatch:
    """``batch`` (or nothing) with ``count`` padding tokens appended as one extra sample that
    has nothing to train on."""
    if batch is not None and count == 0:
        return batch
    long = torch.zeros(count, dtype=torch.long)
    extra = PackedBatch(
        input_ids=long[None],
        positions=long[None],  # position 0: a valid advantage index whatever the samples' lengths
        cu_seqlens=torch.tensor([0, count]),
        target_ids=long,
        loss_mask=torch.zeros(count, dtype=torch.bool),
        behavior_logprobs=torch.zeros(count),
        versions=torch.full((count,), -1, dtype=torch.long),
        sample_index=long,
        temperatures=torch.ones(count),
    )
    if batch is None:
        return extra
    return PackedBatch(
        input_ids=torch.cat([batch.input_ids, extra.input_ids], dim=1),
        positions=torch.cat([batch.positions, extra.positions], dim=1),
        cu_seqlens=torch.cat([batch.cu_seqlens, batch.cu_seqlens[-1:] + count]),
        target_ids=torch.cat([batch.target_ids, extra.target_ids]),
        loss_mask=torch.cat([batch.loss_mask, extra.loss_mask]),
        behavior_logprobs=torch.cat([batch.behavior_logprobs, extra.behavior_logprobs]),
        versions=torch.cat([batch.versions, extra.versions]),
        sample_index=torch.cat([batch.sample_index, extra.sample_index]),
        temperatures=torch.cat([batch.temperatures, extra.temperatures]),
    )


def clip_grad_norm(
    parameters: Sequence[Tensor],
    max_norm: float,
    across: dist.ProcessGroup | None = None,
    also_clip: Sequence[Tensor] = (),
) -> float:
    """Clip by the global 2-norm of gradients that may be DTensors on different meshes.

    ``torch.nn.utils.clip_grad_norm_`` cannot combine DTensors of different meshes (dense
    FSDP×TP weights and expert-parallel ones, say), so the norm is taken per (mesh, placements)
    group, each made a plain tensor (``full_tensor``: the reduction across that group's ranks),
    combined here, and each group is scaled by the same factor. ``across``: ranks holding other
    parameters altogether (pipeline stages), whose squared norms are added. ``also_clip``: scaled
    by the same factor, not counted (a tied weight's second copy).
    """
    groups: dict[object, list[Tensor]] = {}
    for p in parameters:
        g = p.grad
        if g is None:
            continue
        key = (g.device_mesh, tuple(g.placements)) if isinstance(g, DTensor) else None
        groups.setdefault(key, []).append(p)
    norms = []
    for params in groups.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None], 2.0)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    squares = torch.stack(norms).square().sum() if norms else torch.zeros(())
    if across is not None:
        dist.all_reduce(squares, group=across)
    total = squares.sqrt()
    for params in [*groups.values(), *([p] for p in also_clip if p.grad is not None)]:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)


class MeshLayout(SingleProcess):
    """The step's data and reductions on one :class:`ParallelMesh` (forward and backward per
    pack as in one process)."""

    def __init__(self, mesh: ParallelMesh) -> None:
        self.mesh = mesh
        dims = mesh.dims
        self.dp_size, self.dp_rank = dims.dp, mesh.dp_rank
        self.cp_size = dims.cp
        self.cp_rank = mesh["cp"].get_local_rank() if dims.cp_enabled else 0
        self._cp_group = mesh["cp"].get_group() if dims.cp_enabled else None
        # CP gives each rank 1/cp of a pack, sequence-parallel TP splits that over the tp ranks.
        self.multiple = dims.cp * dims.tp
        self._loss_group = mesh["dp_cp"].get_group() if dims.dp_cp > 1 else None

    def packs(
        self, samples: Sequence[Sample], start: int, max_tokens: int | None
    ) -> list[PackedBatch]:
        return self.shard(
            [pad_pack(p, self.multiple) for p in self.dp_packs(samples, start, max_tokens)]
        )

    def dp_packs(
        self, samples: Sequence[Sample], start: int, max_tokens: int | None
    ) -> list[PackedBatch | None]:
        """This dp rank's packs, ``None`` where another dp rank has more packs than this one."""
        shares = split_by_tokens([len(s.input_ids) for s in samples], self.dp_size)
        per_rank = [
            _pack_share([samples[i] for i in share], [start + i for i in share], max_tokens)
            for share in shares
        ]
        n_packs = max(len(p) for p in per_rank)
        own: list[PackedBatch | None] = list(per_rank[self.dp_rank])
        return own + [None] * (n_packs - len(own))

    def shard(self, packs: list[PackedBatch]) -> list[PackedBatch]:
        """This cp rank's slice of each (padded) pack."""
        if self._cp_group is None:
            return packs
        return [shard_sequence(p, self.cp_rank, self.cp_size) for p in packs]

    def attention(self, batch: PackedBatch) -> AttentionBackend:
        if self._cp_group is not None:
            return UlyssesAttention(batch.cu_seqlens, self._cp_group)
        return PackedCausalAttention(batch.cu_seqlens)

    def forward_backward(
        self,
        model: DecoderForCausalLM,
        packs: Sequence[PackedBatch],
        pack_loss: Callable[[int, Tensor], Tensor],
    ) -> None:
        """Per pack as in one process, but FSDP reduces the gradients once, after the last
        pack's backward, instead of after every pack."""
        from torch.distributed.fsdp import FSDPModule

        for j, p in enumerate(packs):
            if isinstance(model, FSDPModule):
                model.set_requires_gradient_sync(j == len(packs) - 1)
            pack_loss(j, token_logprobs(model, p, self.attention(p))).backward()

    def clip_grad_norm(self, parameters: list[Tensor], max_norm: float) -> float:
        return clip_grad_norm(parameters, max_norm)

    def all_reduce(self, tensor: Tensor) -> Tensor:
        if self._loss_group is not None:
            dist.all_reduce(tensor, group=self._loss_group)
        return tensor


def _pack_share(
    samples: list[Sample], indices: list[int], max_tokens: int | None
) -> list[PackedBatch]:
    """``pack`` with ``sample_index`` made the step's own indices."""
    if not samples:
        return []
    packs = pack(samples, max_tokens)
    lookup = torch.tensor(indices, dtype=torch.long)
    for p in packs:
        p.sample_index = lookup[p.sample_index]
    return packs
