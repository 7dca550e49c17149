"""Expert parallelism: each of the ``ep`` ranks holds ``E/ep`` routed experts; tokens travel to them.

:func:`apply_ep` shards every :class:`~areal.plugins.models.layers.Experts` module's stacked
weights along the expert dim (DTensor ``Shard(0)`` on the ``ep`` mesh) and wraps its forward in
a token dispatch and combine, so the model code is unchanged:

1. **dispatch** (pre-hook): each (token, chosen expert) pair is sorted by expert, the per-rank
   counts are exchanged, and one all-to-all sends every token copy to the rank owning its expert;
   the module then runs on the copies it received, with local expert ids and weight 1;
2. **combine** (post-hook): the reverse all-to-all brings each copy's expert output home, where it
   is scaled by its router weight and summed into its token, so the router's gradient stays local.

The ``ep`` ranks are data- or context-parallel ranks (EP adds no ranks), so each sends its own
tokens; the all-to-alls are differentiable and run again in reverse in backward.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor

from areal.plugins.models.layers import Experts

__all__ = ["ExpertDispatch", "apply_ep"]


class ExpertDispatch:
    """The dispatch/combine hooks of one Experts module (state lives from one to the other)."""

    def __init__(self, module: Experts, mesh: DeviceMesh, num_experts: int) -> None:
        self.group = mesh.get_group()
        self.size = mesh.size()
        self.rank = mesh.get_local_rank()
        self.local = num_experts // self.size
        self._route: dict[str, Any] = {}
        module.register_forward_pre_hook(self.dispatch)
        module.register_forward_hook(self.combine)

    def dispatch(self, module: nn.Module, args: tuple[Tensor, Tensor, Tensor]) -> tuple[Any, ...]:
        x, expert_ids, weights = args
        k = expert_ids.shape[1]
        flat_ids = expert_ids.reshape(-1)
        order = torch.argsort(flat_ids, stable=True)
        token_of = torch.arange(x.shape[0], device=x.device).repeat_interleave(k)[order]
        sorted_ids = flat_ids[order]
        send = torch.bincount(sorted_ids // self.local, minlength=self.size)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)  # how many copies come from whom
        send_splits, recv_splits = send.tolist(), recv.tolist()
        ids = torch.empty(sum(recv_splits), dtype=sorted_ids.dtype, device=x.device)
        dist.all_to_all_single(ids, sorted_ids, recv_splits, send_splits, group=self.group)
        copies = _all_to_all(x[token_of], recv_splits, send_splits, self.group)
        self._route = {
            "order": order,
            "token_of": token_of,
            "weights": weights.reshape(-1)[order],
            "send": send_splits,
            "recv": recv_splits,
            "n_tokens": x.shape[0],
            "copies": copies,
        }
        local_ids = (ids - self.rank * self.local)[:, None]
        return copies, local_ids, torch.ones_like(local_ids, dtype=x.dtype)

    def combine(self, module: nn.Module, args: Any, out: Tensor) -> Tensor:
        route, self._route = self._route, {}
        # Zero terms tie every local expert weight and the received copies into the graph, so
        # each rank runs the same backward collectives and FSDP sees a gradient for every shard
        # even when no token came to this rank.
        anchor = sum(_local_sum(p) for p in module.parameters()) + route["copies"].sum()
        back = _all_to_all(out + 0.0 * anchor, route["send"], route["recv"], self.group)
        scaled = back * route["weights"][:, None].to(back.dtype)
        result = torch.zeros(route["n_tokens"], out.shape[1], dtype=out.dtype, device=out.device)
        return result.index_add(0, route["token_of"], scaled)


def apply_ep(model: nn.Module, ep_mesh: DeviceMesh) -> None:
    """Shard and wrap every Experts module of ``model`` over ``ep_mesh``."""
    size = ep_mesh.size()
    for module in model.modules():
        if not isinstance(module, Experts):
            continue
        num_experts = module.gate_proj.shape[0]
        if num_experts % size:
            raise ValueError(
                f"train.parallelism.ep: {size} does not divide num_experts {num_experts}; "
                "use a divisor of it"
            )
        for name, param in list(module.named_parameters(recurse=False)):
            sharded = distribute_tensor(param.data, ep_mesh, [Shard(0)])
            module.register_parameter(
                name, nn.Parameter(sharded, requires_grad=param.requires_grad)
            )
        ExpertDispatch(module, ep_mesh, num_experts)


def _local_sum(param: Tensor) -> Tensor:
    to_local = getattr(param, "to_local", None)
    return (to_local() if callable(to_local) else param).sum()


def _all_to_all(x: Tensor, out_splits: list[int], in_splits: list[int], group: Any) -> Tensor:
    """Rows of ``x`` exchanged by split sizes; differentiable (backward sends them back)."""
    out = funcol.all_to_all_single_autograd(x, out_splits, in_splits, group)
    return funcol.wait_tensor(out)
