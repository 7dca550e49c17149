"""Context parallelism, Ulysses style: sequence shards outside attention, head shards inside.

Each of the ``cp`` ranks holds a contiguous ``1/cp`` of every pack's tokens through the whole
decoder (embedding, norms, MLPs and the loss are token-wise). Attention needs every earlier token
of the sample, so :class:`UlyssesAttention` swaps the split around it with one all-to-all: ``[1,
N/cp, H, D]`` becomes ``[1, N, H/cp, D]`` (all tokens, some heads), the ordinary packed causal
attention runs on it with the pack's full ``cu_seqlens``, and a second all-to-all swaps back.
torch's own ``context_parallel`` shards SDPA through DTensor rules CPU attention lacks; this needs
nothing but all-to-all, which gloo and NCCL both have. Key/value heads that do not divide by
``cp`` (grouped-query attention with few kv heads) are repeated up to the query heads first.
"""

from __future__ import annotations

import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import Tensor

from areal.plugins.trainer.packed_attention import PackedCausalAttention
from areal.plugins.trainer.packing import PackedBatch

__all__ = ["UlyssesAttention", "shard_sequence"]


def shard_sequence(batch: PackedBatch, rank: int, size: int) -> PackedBatch:
    """This rank's contiguous ``1/size`` of a pack (its length must divide by ``size``).

    Per-token tensors are sliced; ``cu_seqlens`` stays the *whole* pack's, which attention needs.
    """
    n = batch.n_tokens
    if n % size:
        raise ValueError(f"a pack of {n} tokens cannot be split over {size} context-parallel ranks")
    a, b = rank * n // size, (rank + 1) * n // size
    return PackedBatch(
        input_ids=batch.input_ids[:, a:b],
        positions=batch.positions[:, a:b],
        cu_seqlens=batch.cu_seqlens,
        target_ids=batch.target_ids[a:b],
        loss_mask=batch.loss_mask[a:b],
        behavior_logprobs=batch.behavior_logprobs[a:b],
        versions=batch.versions[a:b],
        sample_index=batch.sample_index[a:b],
        temperatures=batch.temperatures[a:b],
    )


class UlyssesAttention:
    """An ``AttentionBackend`` for one pack sharded by sequence over the ranks of ``group``."""

    def __init__(self, cu_seqlens: Tensor, group: dist.ProcessGroup) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.inner = PackedCausalAttention(cu_seqlens)

    def attend(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        hq, hkv = q.shape[2], k.shape[2]
        if hq % self.size:
            raise ValueError(
                f"train.parallelism.cp: {self.size} does not divide the {hq} attention heads "
                "of a rank (num_attention_heads / tp); use a divisor of it"
            )
        if hkv % self.size:
            k = k.repeat_interleave(hq // hkv, dim=2)
            v = v.repeat_interleave(hq // hkv, dim=2)
        q, k, v = (self._seq_to_heads(t) for t in (q, k, v))
        return self._heads_to_seq(self.inner.attend(layer_idx, q, k, v))

    def _seq_to_heads(self, x: Tensor) -> Tensor:
        """``[1, S, H, D]`` (S = N/cp) -> ``[1, N, H/cp, D]``."""
        _, s, h, d = x.shape
        # Rank r sends its tokens' head group j to rank j: chunks along heads, stacked first.
        send = x[0].reshape(s, self.size, h // self.size, d).transpose(0, 1).contiguous()
        recv = _all_to_all(send, self.group)  # [cp, S, H/cp, D]: chunk i = rank i's tokens
        return recv.reshape(1, self.size * s, h // self.size, d)

    def _heads_to_seq(self, x: Tensor) -> Tensor:
        """``[1, N, H/cp, D]`` -> ``[1, S, H, D]``: the inverse of :meth:`_seq_to_heads`."""
        _, n, hl, d = x.shape
        s = n // self.size
        send = x[0].reshape(self.size, s, hl, d).contiguous()  # chunk j: rank j's tokens
        recv = _all_to_all(send, self.group)  # [cp, S, H/cp, D]: chunk i = head group i
        return recv.transpose(0, 1).reshape(1, s, self.size * hl, d)


def _all_to_all(x: Tensor, group: dist.ProcessGroup) -> Tensor:
    """Equal-split all-to-all along dim 0, differentiable (backward is the reverse exchange)."""
    out = funcol.all_to_all_single_autograd(x.flatten(), None, None, group)
    return funcol.wait_tensor(out).view_as(x)
