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
"""

from __future__ import annotations

import torch
from torch import nn

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


def _stamp(weight: torch.Tensor) -> tuple[int, int]:
    """What an in-place write (version) or a swapped storage (address) changes."""
    return weight._version, weight.data_ptr()


class PackedLinear(nn.Module):
    """An ``nn.Linear`` on a packed copy of its weight. It holds the very ``Parameter`` objects of
    the layer it replaces, so names, tied weights and in-place updates are unchanged."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        # a plain attribute, not a buffer: not in state_dict, untouched by .to(); refreshed by
        # copying into it, so a compiled graph holding it sees the new values
        self.packed = _pack(self.weight)
        self._stamp = _stamp(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            # inductor lowers mkldnn's op only for constant (frozen) weights; this op is opaque
            # to it (registered by compiled_decode.py)
            out: torch.Tensor = torch.ops.areal.packed_linear(x, self.packed, self.bias)
            return out
        out = torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return out

    def refresh(self) -> bool:
        """Re-pack if the weight changed since the last pack; True if it did."""
        stamp = _stamp(self.weight)
        if stamp == self._stamp:
            return False
        self.packed.copy_(_pack(self.weight))
        self._stamp = stamp
        return True

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed"


class PackedWeights:
    """Every ``nn.Linear`` of a model replaced by a :class:`PackedLinear`, and their refresh."""

    def __init__(self, model: nn.Module) -> None:
        self.layers: list[PackedLinear] = []
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear:
                    packed = PackedLinear(child)
                    setattr(parent, name, packed)
                    self.layers.append(packed)

    def refresh(self) -> int:
        """Re-pack every weight written since its last pack (a few µs when none was); returns
        how many were. Call before every forward that uses the packed layers."""
        return sum(layer.refresh() for layer in self.layers)
