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

Whether packing pays depends on the CPU: on an AVX2 AMD host it did (above); on an AVX-512
Intel host the plain layers were faster at every decode size (the small model's forward over
one token a row: 3.21 against 4.34 ms at 1 row, 6.08 against 6.38 at 16; the engine decoded a
lone request 25 % faster unpacked). So by default the engine measures both on its own CPU at
start-up (:func:`measure_packing`, ~0.35 s for the small model) and packs only when it is
faster; ``EngineConfig.pack_weights`` True or False skips the measurement.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

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
        # split_with_sizes: Tensor.split's Python wrapper cost ~6 us a call, 20 calls a step
        return tuple(out.split_with_sizes(self.sizes, dim=-1)) if self.fused else out

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
        # (owner, name, what was there: the linear a single layer replaced, None for a fused one)
        self._placed: list[tuple[nn.Module, str, nn.Module | None]] = []
        for owner, name, group in _groups(model):
            self._placed.append((owner, name, None if len(group) > 1 else group[0]))
            setattr(owner, name, self._add(*group))

    def remove(self) -> None:
        """Put the model back as it was: its own linear layers, no fused ones."""
        for owner, name, linear in reversed(self._placed):
            if linear is None:
                delattr(owner, name)
            else:
                setattr(owner, name, linear)
        self._placed.clear()
        self.layers.clear()

    def _add(self, *linears: nn.Linear) -> PackedLinear:
        layer = PackedLinear(*linears)
        self.layers.append(layer)
        return layer

    def refresh(self) -> int:
        """Re-pack every layer whose weights were written since its last pack (a few µs when
        none was); returns how many were. Call before every forward that uses them."""
        return sum(layer.refresh() for layer in self.layers)


def _groups(model: nn.Module) -> Iterator[tuple[nn.Module, str, list[nn.Linear]]]:
    """Each packed layer to be: (the module that will hold it, under what name, its linears).
    q/k/v and gate/up are one each (``qkv_proj``, ``gate_up_proj``); every other ``nn.Linear``
    is one, in its own place."""
    fused: set[nn.Module] = set()
    for module in list(model.modules()):
        if isinstance(module, Attention):
            group = [module.q_proj, module.k_proj, module.v_proj]
            yield module, "qkv_proj", group
        elif isinstance(module, MLP):
            group = [module.gate_proj, module.up_proj]
            yield module, "gate_up_proj", group
        else:
            continue
        fused.update(group)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child not in fused:
                yield parent, name, [child]


@dataclass(frozen=True)
class PackingChoice:
    """What :func:`measure_packing` found: the model's forward over one new token per row, both
    ways, in ms (the sum over the measured row counts), and which was faster."""

    packed_ms: float
    plain_ms: float

    @property
    def pays(self) -> bool:
        return self.packed_ms < self.plain_ms

    def to_json(self) -> dict[str, float | bool]:
        return {"packed_ms": self.packed_ms, "plain_ms": self.plain_ms, "packed": self.pays}


MEASURED_ROWS = (1, ROWS_HINT)  # a lone request's decode step and a batch's


def measure_packing(
    model: nn.Module, rows: tuple[int, ...] = MEASURED_ROWS, repeats: int = 3, calls: int = 5
) -> PackingChoice:
    """Time the model's forward on this CPU over one token per row (a decode step's shapes,
    without the KV cache), on its own linear layers and on packed ones, at ``rows`` rows; the
    best of ``repeats`` rounds of ``calls`` calls each, so another process's burst does not
    decide. The whole forward, not the linear layers alone: timed alone, packed and plain
    layers measured the same on an AVX-512 host where the packed forward was 35 % slower at
    one row. The model is left as it was."""
    ids = {n: torch.zeros(n, 1, dtype=torch.long) for n in rows}
    with torch.inference_mode():
        plain_s = sum(_best(partial(model, ids[n]), repeats, calls) for n in rows)
        packed = PackedWeights(model)
        try:
            packed_s = sum(_best(partial(model, ids[n]), repeats, calls) for n in rows)
        finally:
            packed.remove()
    return PackingChoice(round(1000 * packed_s, 3), round(1000 * plain_s, 3))


def _best(call: Callable[[], object], repeats: int, calls: int) -> float:
    """Seconds per call: the fastest of ``repeats`` rounds (after one warm-up call)."""
    call()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - start) / calls)
    return best
