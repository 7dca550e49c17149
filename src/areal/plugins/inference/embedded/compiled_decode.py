"""An opt-in compiled decode step: the whole forward of a padded decode batch as one graph.

Why: in an eager decode step of the ``small`` model at 16 rows, the matrix multiplies are only
about half the time. The rest is some 35 small ops per layer (norms, rotary embedding, residual
adds, the KV write and gather), each a Python call and a dispatch, and the gaps between them
also slow the GEMMs' threads. ``torch.compile`` (inductor, C++ on CPU) turns a step into one
call: the elementwise work fused into a few loops, the GEMMs and attention called back to back.

The rows and the key span are dynamic, so one compile serves every step of every batch size,
and a second one a batch of one row (torch specialises size 1). Weights are graph inputs,
not constants, so weights copied into the parameters in place are used by the next step.
Without the decode kernel (decode_kernel.py), steps whose rows attend in more than one bucket
(very different lengths) run eagerly; with it every decode step is one bucket.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from areal.plugins.inference.embedded import decode_kernel
from areal.plugins.inference.embedded.kv_pool import TokenKVPool
from areal.plugins.inference.embedded.packed_linear import linear_on_packed
from areal.plugins.inference.embedded.paged_attention import PagedAttention
from areal.plugins.models.attention import QKNorms, masked_attention
from areal.plugins.models.decoder import DecoderForCausalLM

log = logging.getLogger("areal.inference")


_LIB = torch.library.Library("areal", "DEF")  # kept alive: the op lives as long as the library
_LIB.define(
    "paged_decode_attention(Tensor q, Tensor k, Tensor v, Tensor(a!) k_layer, Tensor(b!) v_layer,"
    " Tensor write, Tensor read, Tensor mask) -> Tensor"
)


def _paged_decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_layer: torch.Tensor,
    v_layer: torch.Tensor,
    write: torch.Tensor,
    read: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """Write the new keys and values [B, 1, Hkv, D] into their ``write`` slots, gather the
    ``read`` [B, span] slots of each row and attend.

    An opaque op inside the compiled step: ATen's gather and SDPA ran it ~2x faster than
    inductor's code for it. Registered with ``Library.impl`` rather than ``custom_op``, whose
    Python wrappers cost ~0.1 ms a call, ten calls a step."""
    heads = k_layer.shape[1:]
    k_layer.index_copy_(0, write, k.reshape(-1, *heads).to(k_layer.dtype))
    v_layer.index_copy_(0, write, v.reshape(-1, *heads).to(v_layer.dtype))
    shape = (*read.shape, *heads)
    keys = k_layer.index_select(0, read.view(-1)).view(shape).to(q.dtype)
    values = v_layer.index_select(0, read.view(-1)).view(shape).to(q.dtype)
    return masked_attention(q, keys, values, mask)


def _paged_decode_attention_fake(q: torch.Tensor, *args: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(q)


_LIB.impl("paged_decode_attention", _paged_decode_attention, "CPU")
torch.library.register_fake("areal::paged_decode_attention", _paged_decode_attention_fake, lib=_LIB)

_LIB.define("packed_linear(Tensor x, Tensor packed, Tensor? bias) -> Tensor")


def _packed_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """oneDNN's linear on a weight packed by packed_linear.py. An opaque op inside the compiled
    step: inductor lowers ``mkldnn._linear_pointwise`` only when the weight is a frozen constant,
    and these weights are graph inputs so that a re-pack after an update is seen."""
    return linear_on_packed(x, packed, bias)


def _packed_linear_fake(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], packed.shape[0]))


# the packed weight is an mkldnn tensor, so the op dispatches on MkldnnCPU as well as CPU
_LIB.impl("packed_linear", _packed_linear, "CompositeExplicitAutograd")
torch.library.register_fake("areal::packed_linear", _packed_linear_fake, lib=_LIB)


class GatherAttention:
    """One bucket of paged attention for the compiled step: the step's tensors, and the op above
    (or the C++ kernel's, with ``kernel``) for every layer (no buffers kept across calls, which
    a graph could not hold)."""

    def __init__(
        self,
        pool: TokenKVPool,
        write: torch.Tensor,
        read: torch.Tensor,
        mask: torch.Tensor,
        lens: torch.Tensor,
        kernel: bool,
    ) -> None:
        self.k = pool.k
        self.v = pool.v
        self.write = write  # [B] slots of the new tokens
        self.read = read  # [B, span] slots each row reads (padding reads slot 0, masked)
        self.mask = mask  # [B, 1, 1, span]
        self.lens = lens  # [B] slots each row reads
        self.kernel = kernel
        self.fuses_rope = kernel  # the kernel applies q/k norms and RoPE too (attend_rope)
        # Flat tensors, not decode_kernel.KernelSlots as the eager step uses: the graph guards
        # on every object it reads, and a nested one made the compiled step ~0.4 ms slower.

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
        return decode_kernel.attend_rope(
            q,
            k,
            v,
            self.k[layer_idx],
            self.v[layer_idx],
            self.write,
            self.read,
            self.lens,
            cos,
            sin,
            norms,
        )

    def attend(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        if self.kernel:
            return decode_kernel.attend(
                q, k, v, self.k[layer_idx], self.v[layer_idx], self.write, self.read, self.lens
            )
        out: torch.Tensor = torch.ops.areal.paged_decode_attention(
            q, k, v, self.k[layer_idx], self.v[layer_idx], self.write, self.read, self.mask
        )
        return out


def _decode_logits(
    model: DecoderForCausalLM,
    ids: torch.Tensor,
    positions: torch.Tensor,
    attention: GatherAttention,
) -> torch.Tensor:
    """fp32 logits [B, V] of a decode step's one new token per row."""
    hidden = model.hidden_states(ids, positions, attention)
    return model.lm_head(hidden[:, -1]).float()


class CompiledDecode:
    """The compiled decode step of one model; ``warm_up`` compiles it before the first request."""

    # A step that would need a new graph (anything warm_up did not cover) runs eagerly instead
    # of stalling every request for a compile; tests set "fail_on_recompile".
    stance = "eager_on_recompile"

    def __init__(self, model: DecoderForCausalLM, pool: TokenKVPool, kernel: bool = False) -> None:
        self.model = model
        self.pool = pool
        self.kernel = kernel  # attend in the C++ kernel (decode_kernel.py), compiled as one op
        self._fn: Any = torch.compile(_decode_logits)

    @staticmethod
    def fits(ids: torch.Tensor, attention: PagedAttention) -> bool:
        """One new token per row, and every row in one bucket."""
        return ids.shape[1] == 1 and len(attention.buckets) == 1

    def __call__(
        self, ids: torch.Tensor, positions: torch.Tensor, attention: PagedAttention
    ) -> torch.Tensor:
        """Logits [B, V] of a step that :meth:`fits`; writes the new keys and values."""
        bucket = attention.buckets[0]
        read = bucket.read.view(ids.shape[0], bucket.span)
        gather = GatherAttention(
            self.pool, attention.write_slots, read, bucket.mask, bucket.lens, self.kernel
        )
        with torch.compiler.set_stance(self.stance):
            logits: torch.Tensor = self._fn(self.model, ids, positions, gather)
        return logits

    def warm_up(self) -> float:
        """Compile for a batch of one row and one of several, on dummy steps that write only the
        pool's scratch slot 0. Only the rows and the key span are dynamic (everything else, the
        pool's shape included, stays fixed in the graph); their warm-up sizes differ so that
        torch does not assume them equal. Returns the seconds taken."""
        start = time.perf_counter()
        with torch.inference_mode():
            for rows, span in ((1, 2), (2, 3)):
                ids = torch.zeros(rows, 1, dtype=torch.long)
                positions = torch.full((rows, 1), span - 1, dtype=torch.long)
                write = torch.zeros(rows, dtype=torch.long)
                read = torch.zeros(rows, span, dtype=torch.long)
                mask = torch.ones(rows, 1, 1, span, dtype=torch.bool)
                lens = torch.full((rows,), span, dtype=torch.long)
                if rows > 1:  # torch specialises size 1: a batch of one row has its own graph
                    for tensor in (ids, positions, write, read, mask, lens):
                        torch._dynamo.mark_dynamic(tensor, 0)
                torch._dynamo.mark_dynamic(read, 1)
                torch._dynamo.mark_dynamic(mask, 3)
                attention = GatherAttention(self.pool, write, read, mask, lens, self.kernel)
                self._fn(self.model, ids, positions, attention)
        seconds = time.perf_counter() - start
        log.info("compiled the decode step in %.1f s", seconds)
        return seconds
