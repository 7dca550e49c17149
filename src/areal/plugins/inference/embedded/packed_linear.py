"""Linear layers on weights pre-packed for oneDNN, re-packed whenever a weight changes.

Why: the engine's GEMMs are small (16 rows × a few hundred columns at decode), and MKL's ``mm``
reads the weight in its plain layout every call. oneDNN's inner product on a weight reordered
once into its own blocked layout (``mkldnn._reorder_linear_weight``, what inductor's freezing
pass does for constant weights) ran the ``small`` model's 71 decode GEMMs at 16 rows in
5.7–6.3 ms against 7.3–9.7 ms for ``aten::mm``, and prefill-sized ones (256 rows) ~25 % faster.

The packed copy goes stale when the weight changes. Every weight update in the engine copies
into the parameters in place, and every in-place write bumps the parameter's version counter,
so :meth:`PackedWeights.refresh` (called before every forward) re-packs exactly the weights
whose version or storage moved: one mechanism for every update path (disk, broadcast, tests).
Writes through ``param.data`` bypass the version counter and are not seen: none of the
engine's paths use it. The packed copies cost a second copy of every linear weight in memory.

Projections of one input are packed as one weight (q, k and v; gate and up), so they run as one
GEMM: with MKL's plain layout the wider GEMM was slower (benchmarks.md, "fused projections"), on
the packed layout it saved ~1.9 ms of an eager and ~1.1 ms of a compiled decode step at 16 rows.
The model's layers use such a fused layer when the engine has set one (``qkv_proj``,
``gate_up_proj``); the separate layers keep the parameters, which updates write as before.
"""

from __future__ import annotations

import torch
from torch import nn

from areal.plugins.models.layers import MLP, Attention

# The rows oneDNN picks the packed layout for (a decode batch); any row count computes right.
ROWS_HINT = 16


def can_pack(model: nn.Module) -> bool:
    """oneDNN is built in and the model's weights are fp32 on the CPU (the engine's case)."""
    if not (torch.backends.mkldnn.enabled and torch.backends.mkldnn.is_available()):
        return False
    params = list(model.parameters())
    return bool(params) and all(p.dtype == torch.float32 and p.device.type == "cpu" for p in params)


def _pack(weight: torch.Tensor) -> torch.Tensor:
    packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)
    return packed


def linear_on_packed(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """oneDNN's linear on a weight ``_pack`` made."""
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return out


def _stamp(tensors: list[torch.Tensor]) -> list[tuple[int, int]]:
    """What an in-place write (version) or a swapped storage (address) changes."""
    return [(t._version, t.data_ptr()) for t in tensors]


class PackedLinear(nn.Module):
    """``nn.Linear`` (or several of one input, stacked by rows) on a packed copy of the weight.

    Of one layer, it holds that layer's very ``Parameter`` objects and takes its place: names,
    tied weights and in-place updates are unchanged. Of several (``sizes``), it holds no
    parameters (the layers stay where they are, holding them) and returns one output per layer.
    """

    def __init__(self, *linears: nn.Linear) -> None:
        super().__init__()
        self.in_features = linears[0].in_features
        self.sizes = [linear.out_features for linear in linears]
        self.fused = len(linears) > 1
        self._weights: list[torch.Tensor] = [linear.weight for linear in linears]
        self._biases: list[torch.Tensor] = [lin.bias for lin in linears if lin.bias is not None]
        if not self.fused:  # registered: the parameters keep their names in the state dict
            self.weight = linears[0].weight
            self.bias = linears[0].bias
        # plain tensors, not parameters or buffers: outside the state dict, untouched by .to()
        self.packed = self._pack()
        self.fused_bias = torch.cat(self._biases).detach() if self.fused and self._biases else None
        self._stamps = self._stamp()

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        bias = self.fused_bias if self.fused else self.bias
        if torch.compiler.is_compiling():
            # inductor lowers mkldnn's op only for constant (frozen) weights; this op is opaque
            # to it (registered by compiled_decode.py)
            out = torch.ops.areal.packed_linear(x, self.packed, bias)
        else:
            out = linear_on_packed(x, self.packed, bias)
        return out.split(self.sizes, dim=-1) if self.fused else out

    def _pack(self) -> torch.Tensor:
        return _pack(torch.cat(self._weights) if self.fused else self._weights[0])

    def _stamp(self) -> list[tuple[int, int]]:
        """Of what the packed copies hold: the weights, and a fused layer's biases (one layer
        adds its own bias parameter, which needs no copy)."""
        return _stamp(self._weights + self._biases if self.fused else self._weights)

    def refresh(self) -> bool:
        """Re-pack if a weight or bias changed since the last pack; True if one did. The new
        values are copied into the packed tensors, so a compiled graph holding them sees them."""
        stamps = self._stamp()
        if stamps == self._stamps:
            return False
        self.packed.copy_(self._pack())
        if self.fused_bias is not None:
            self.fused_bias.copy_(torch.cat(self._biases))
        self._stamps = stamps
        return True

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.sizes}, packed"


class PackedWeights:
    """A model's linear layers on packed weights: q/k/v and gate/up each fused into one
    :class:`PackedLinear` the layer uses, every other ``nn.Linear`` replaced by one."""

    def __init__(self, model: nn.Module) -> None:
        self.layers: list[PackedLinear] = []
        fused: set[nn.Module] = set()
        for module in list(model.modules()):
            if isinstance(module, Attention):
                group = [module.q_proj, module.k_proj, module.v_proj]
                module.qkv_proj = self._add(*group)
            elif isinstance(module, MLP):
                group = [module.gate_proj, module.up_proj]
                module.gate_up_proj = self._add(*group)
            else:
                continue
            fused.update(group)
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear and child not in fused:
                    setattr(parent, name, self._add(child))

    def _add(self, *linears: nn.Linear) -> PackedLinear:
        layer = PackedLinear(*linears)
        self.layers.append(layer)
        return layer

    def refresh(self) -> int:
        """Re-pack every layer whose weights were written since its last pack (a few µs when
        none was); returns how many were. Call before every forward that uses them."""
        return sum(layer.refresh() for layer in self.layers)
