"""Loss-parallel log-probs: ``log softmax(logits)[target]`` on vocabulary-sharded logits.

With tensor parallelism the LM head keeps its output sharded along the vocabulary (``Shard(-1)``),
so no rank ever holds the ``[tokens, vocab]`` logits whole — for a 150k vocabulary that tensor is
the largest of the step. Each rank computes its shard's max, sum of exponentials and (where the
target falls in its shard) the target's logit; three all-reduces over the TP group finish the
log-softmax. torch's own ``loss_parallel`` context needs the backward inside the context too,
which the pipeline schedules run elsewhere, so this is written out with an explicit autograd rule.

The all-reduces of values the loss depends on use Megatron's rule: sum in the forward, identity in
the backward. Every TP rank computes the same (replicated) loss from the reduced values, so the
gradient each rank needs for its shard is the local one; summing gradients there would count it
``tp`` times.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor


class _SumForwardIdentityBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: Tensor, group: Any) -> Tensor:
        out = tensor.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


def vocab_parallel_logprobs(
    logits: DTensor, targets: Tensor, temperatures: Tensor | None = None
) -> Tensor:
    """``[M]`` float32 log-probs of ``targets`` under ``logits`` ``[M, V]`` sharded on V, each
    row divided by its sampling temperature (``[M]``) first."""
    mesh = logits.device_mesh
    group, rank = mesh.get_group(), mesh.get_local_rank()
    local = logits.to_local().float()  # [M, V / tp]; its gradient flows back to the shard
    if temperatures is not None:
        local = local / temperatures[:, None]
    width = local.shape[-1]
    start = rank * width
    # The max only keeps exp() in range: it cancels out, no gradient needed through it.
    peak = local.detach().amax(-1)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
    shifted = local - peak[:, None]
    sum_exp = _SumForwardIdentityBackward.apply(shifted.exp().sum(-1), group)
    here = (targets >= start) & (targets < start + width)
    index = (targets - start).clamp(0, width - 1)
    target_logit = shifted.gather(-1, index[:, None]).squeeze(-1) * here
    target_logit = _SumForwardIdentityBackward.apply(target_logit, group)
    return target_logit - sum_exp.log()
