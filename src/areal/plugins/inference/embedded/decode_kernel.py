"""The decode step's attention as one C++ call per layer (``decode_attention.cpp``).

Why: at 16 rows of the ``small`` model a decode step's attention was ATen's write (two
``index_copy_``), gather (two ``index_select`` of every row's keys and values, padded to the
longest row) and SDPA: 104 us a layer at 96 keys a row, 190 at 160, about a fifth of the step,
most of it calls and copies rather than arithmetic. The kernel writes the new keys and values,
then reads each row's keys in place from the pool, only as many as the row has (no padding, so
rows of very different lengths need no buckets): 37 and 51 us on the same inputs (2 threads).

The model hands a decode step's q, k and v to the engine's attention as the projection made
them (:func:`attend_rope`, the backend's ``fuses_rope``): the kernel applies Qwen3's per-head
norms and the rotary embedding to the query and the new key itself, ~20 small ops a layer that
the eager step would otherwise run one by one (each a Python call and a dispatch): the eager
16-row step of the ``small`` model takes 7.7-8.1 ms with it against 8.9 without. The compiled
step calls it too (its elementwise code does the same work in fused loops: no gain there). The
same build has a one-call RMSNorm (torch's CPU ``rms_norm`` is seven ops), which an eager
engine's model uses for every norm (:func:`use_kernel_norms`): 6.9-7.5 ms against 7.7-8.1. A
compiled engine keeps the model's own norms, which inductor fuses with their neighbours. And an
eager step's whole stack of decoder layers is one call (:class:`LayerLoop`, ``decode_layers``):
5.4-5.9 ms against 7.2-7.5 layer by layer.

It is built once per machine by torch's ``cpp_extension`` (ninja and a C++ compiler, ~6 s) into
``areal/<name>`` under torch's extensions directory, the name made of the digest of the source,
the flags and torch's version, so a changed source, another instruction set or another torch
builds anew; ``make setup`` builds it ahead
(``python -m areal.plugins.inference.embedded.decode_kernel``). Where it cannot be built (no
compiler), or the pool is not float32, the engine attends with ATen instead, and says which
in ``/server_info``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import platform
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from areal.plugins.models.attention import QKNorms

if TYPE_CHECKING:
    from areal.plugins.models.decoder import DecoderForCausalLM

log = logging.getLogger("areal.inference")

SOURCE = Path(__file__).with_name("decode_attention.cpp")


@dataclass(frozen=True)
class KernelStatus:
    loaded: bool
    detail: str  # the build's name, or why there is none


def _flags() -> list[str]:
    """-ffast-math: the sums may be reordered (to vectorise), which moves results by ~1e-6 like
    any other kernel's summation order; the code never meets an infinity or a NaN it made."""
    flags = ["-O3", "-ffast-math", "-fopenmp"]
    if platform.machine() in ("x86_64", "AMD64") and torch.backends.cpu.get_cpu_capability() in (
        "AVX2",
        "AVX512",
    ):
        flags.append("-march=x86-64-v3")  # AVX2 and FMA; measured as fast as AVX-512 here
    return flags


@functools.cache
def load() -> KernelStatus:
    """Build (or find built) and load the kernel once per process."""
    flags = _flags()
    source = SOURCE.read_bytes()
    key = source + " ".join([*flags, torch.__version__]).encode()  # torch's ABI too
    name = f"areal_decode_attention_{hashlib.sha256(key).hexdigest()[:12]}"
    if (
        shutil.which("ninja") is None
    ):  # the pip package's binary, off PATH outside an activated venv
        with contextlib.suppress(ImportError):
            import ninja

            os.environ["PATH"] = f"{ninja.BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"
    try:
        from torch.utils.cpp_extension import get_default_build_root
        from torch.utils.cpp_extension import load as build_and_load

        # The source goes into the build directory first: ninja rebuilds when a source's path
        # changes, so checkouts in different places (a benchmark's `git archive` of another
        # revision) would otherwise rebuild the same kernel over each other.
        root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
        build = Path(root, "areal", name)
        build.mkdir(parents=True, exist_ok=True)
        copy = build / SOURCE.name
        if not copy.is_file() or copy.read_bytes() != source:
            partial = build / f"{SOURCE.name}.{os.getpid()}.tmp"
            partial.write_bytes(source)
            partial.replace(copy)  # atomic: a concurrent start never compiles half a file
        build_and_load(
            name=name,
            sources=[str(copy)],
            build_directory=str(build),
            extra_cflags=flags,
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
            verbose=False,
        )
    except Exception as err:  # no compiler, no ninja, a toolchain without OpenMP: ATen it is
        reason = f"{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err) else ''}"
        log.warning("decode attention: the C++ kernel could not be built (%s); using ATen", reason)
        return KernelStatus(False, reason)
    torch.library.register_fake("areal_kernels::paged_decode")(_paged_decode_fake)
    torch.library.register_fake("areal_kernels::paged_decode_rope")(_paged_decode_fake)
    torch.library.register_fake("areal_kernels::rms_norm")(_paged_decode_fake)
    torch.library.register_fake("areal_kernels::decode_layers")(_paged_decode_fake)
    return KernelStatus(True, name)


def _paged_decode_fake(q: torch.Tensor, *args: object) -> torch.Tensor:
    # What a compiled step needs to know of the output: q's shape, contiguous.
    return q.new_empty(q.shape)


def attend(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_layer: torch.Tensor,
    v_layer: torch.Tensor,
    write: torch.Tensor,
    read: torch.Tensor,
    lens: torch.Tensor,
) -> torch.Tensor:
    """q [B, 1, Hq, D]; the new k/v [W, 1, Hkv, D] (or [W, Hkv, D]) go to the ``write`` [W]
    slots of the layer's pool [N, Hkv, D]; row b attends over its first ``lens[b]`` slots of
    ``read`` [B, span]. Returns [B, 1, Hq, D]. :func:`load` must have succeeded."""
    rows, _, q_heads, dim = q.shape
    kv_heads = k_layer.shape[1]
    out: torch.Tensor = torch.ops.areal_kernels.paged_decode(
        q.reshape(rows, q_heads, dim).contiguous(),
        k_new.reshape(-1, kv_heads, dim).contiguous(),
        v_new.reshape(-1, kv_heads, dim).contiguous(),
        k_layer,
        v_layer,
        write,
        read,
        lens,
    )
    return out.view(rows, 1, q_heads, dim)


def attend_rope(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_layer: torch.Tensor,
    v_layer: torch.Tensor,
    write: torch.Tensor,
    read: torch.Tensor,
    lens: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    norms: QKNorms,
) -> torch.Tensor:
    """:func:`attend` on the projections as the linear layer made them: the kernel applies the
    per-head norms (``norms``: the q and k norms' weights and epsilon; None: none) and the
    rotary embedding (``cos``, ``sin`` [B, 1, D]) to q and the new k first. q [B, 1, Hq, D],
    k_new and v_new [B, 1, Hkv, D] (views of one projection are fine: no copy is made)."""
    rows, _, q_heads, dim = q.shape
    q_norm, k_norm, eps = norms if norms is not None else (None, None, 0.0)
    out: torch.Tensor = torch.ops.areal_kernels.paged_decode_rope(
        q.select(1, 0),
        k_new.select(1, 0),
        v_new.select(1, 0),
        k_layer,
        v_layer,
        write,
        read,
        lens,
        cos.select(1, 0),
        sin.select(1, 0),
        q_norm,
        k_norm,
        eps,
    )
    return out.view(rows, 1, q_heads, dim)


@dataclass(frozen=True)
class KernelSlots:
    """A decode step's pool and slots as the kernel reads them, shared by every layer: the
    pool's per-layer keys and values, each row's new slot (``write`` [B]), the slots each row
    reads (``read`` [B, span]) and how many (``lens`` [B])."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    write: torch.Tensor
    read: torch.Tensor
    lens: torch.Tensor

    def attend(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        return attend(
            q, k, v, self.k[layer_idx], self.v[layer_idx], self.write, self.read, self.lens
        )

    def attend_rope(
        self,
        layer_idx: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        norms: QKNorms,
    ) -> torch.Tensor:
        layer = (self.k[layer_idx], self.v[layer_idx])
        return attend_rope(q, k, v, *layer, self.write, self.read, self.lens, cos, sin, norms)


class LayerLoop:
    """An eager decode step's decoder layers in one C++ call (``areal_kernels::decode_layers``).

    Why: with the attention, norms and RoPE already in the kernel, the eager 16-row step of the
    ``small`` model still spent ~1.5 ms of its ~7 in Python: ten module calls a layer and the
    views between them. The C++ loop runs the same ops (the same GEMMs, on the same packed or
    plain weights, the kernel's RMSNorm and attention) with no Python between them. Only a
    dense model's layers (every MLP a SwiGLU, no experts) on float32 weights qualify: :meth:`of`
    says None otherwise and the model's own modules run. The weights are read from the modules
    at every step, so an update in place, a re-pack or a swapped parameter is always seen.
    """

    def __init__(self, model: DecoderForCausalLM, packed: bool) -> None:
        self.body = model.model
        self.packed = packed
        first: Any = model.model.layers[0]  # every layer's norms share the config's epsilon
        self.eps = first.input_layernorm.eps
        self.qk_eps = first.self_attn.q_norm.eps if hasattr(first.self_attn, "q_norm") else 0.0

    @staticmethod
    def of(model: torch.nn.Module) -> LayerLoop | None:
        """The loop over ``model``'s layers, or None if a layer is not of the dense kind it runs
        (:func:`load` must have succeeded)."""
        from areal.plugins.inference.embedded.packed_linear import PackedLinear
        from areal.plugins.models.decoder import DecoderForCausalLM, DecoderLayer
        from areal.plugins.models.layers import MLP, Attention

        if not isinstance(model, DecoderForCausalLM):
            return None
        if any(p.dtype != torch.float32 for p in model.parameters()):
            return None
        layers = list(model.model.layers)
        if not all(
            type(layer) is DecoderLayer
            and type(layer.self_attn) is Attention
            and type(layer.mlp) is MLP
            for layer in layers
        ):
            return None
        first: Any = layers[0]
        return LayerLoop(model, packed=isinstance(first.self_attn.o_proj, PackedLinear))

    def arguments(self) -> tuple[list[torch.Tensor], list[torch.Tensor | None], list[int],
                                 list[torch.Tensor], list[torch.Tensor | None]]:  # fmt: skip
        """decode_layers' per-layer lists: linear weights, their biases, the q/k/v and gate/up
        linears' counts, the two norms' weights, the q/k norms' weights."""
        weights: list[torch.Tensor] = []
        biases: list[torch.Tensor | None] = []
        groups: list[int] = []
        norms: list[torch.Tensor] = []
        qk_norms: list[torch.Tensor | None] = []
        layer: Any
        for layer in self.body.layers:
            attention, mlp = layer.self_attn, layer.mlp
            qkv = _linears(attention, "qkv_proj", ("q_proj", "k_proj", "v_proj"))
            gate_up = _linears(mlp, "gate_up_proj", ("gate_proj", "up_proj"))
            for linear in (*qkv, attention.o_proj, *gate_up, mlp.down_proj):
                weights.append(linear.packed if self.packed else linear.weight)
                fused = self.packed and linear.fused
                biases.append(linear.fused_bias if fused else linear.bias)
            groups += (len(qkv), len(gate_up))
            norms += (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
            if hasattr(attention, "q_norm"):
                qk_norms += (attention.q_norm.weight, attention.k_norm.weight)
            else:
                qk_norms += (None, None)
        return weights, biases, groups, norms, qk_norms

    def hidden_states(
        self, ids: torch.Tensor, positions: torch.Tensor, slots: KernelSlots
    ) -> torch.Tensor:
        """The final-norm hidden states [B, 1, H] of a decode step (one new token a row)."""
        body = self.body
        x = body.embed_tokens(ids[:, 0])
        cos, sin = body.rotary_emb(positions[:, 0], x.dtype)
        weights, biases, groups, norms, qk_norms = self.arguments()
        hidden = torch.ops.areal_kernels.decode_layers(
            x, weights, biases, groups, norms, qk_norms, slots.k, slots.v,
            slots.write, slots.read, slots.lens, cos, sin, self.eps, self.qk_eps, self.packed,
        )  # fmt: skip
        out: torch.Tensor = body.norm(hidden)[:, None]
        return out


def _linears(owner: torch.nn.Module, fused: str, separate: tuple[str, ...]) -> list[Any]:
    """The one fused linear an engine set (``qkv_proj``, ``gate_up_proj``), else the separate
    ones."""
    if hasattr(owner, fused):
        return [getattr(owner, fused)]
    return [getattr(owner, name) for name in separate]


def use_kernel_norms(model: torch.nn.Module) -> int:
    """Every float32 RMSNorm of an inference engine's ``model`` runs in the kernel's one call
    (no gradient: never a model being trained); the number of norms. :func:`load` must have
    succeeded."""
    from areal.plugins.models.layers import RMSNorm

    count = 0
    for module in model.modules():
        if isinstance(module, RMSNorm) and module.weight.dtype == torch.float32:
            module.forward = functools.partial(_kernel_rms_norm, module)  # type: ignore[method-assign]
            count += 1
    return count


def _kernel_rms_norm(norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    # A compiled step (compiled_decode.py) traces the model's own code: inductor fuses the norm
    # with the ops around it, which an opaque call would prevent (measured: 6.4 ms a step with
    # the call, 6.0 without).
    if x.dtype != torch.float32 or torch.compiler.is_compiling():
        return type(norm).forward(norm, x)  # type: ignore[no-any-return]
    out: torch.Tensor = torch.ops.areal_kernels.rms_norm(x.contiguous(), norm.weight, norm.eps)
    return out


def main() -> int:
    """Build the kernel now (``make setup``), so no engine start pays for it; never fails."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    status = load()
    print(f"decode attention kernel: {'built' if status.loaded else 'not built'} ({status.detail})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
