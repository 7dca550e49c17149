"""A fixed KV-cache budget: one slot per token, allocated up front (SGLang's token-to-KV pool).

Memory is reserved once at start, so a sustained load reuses slots instead of growing memory.
Slot 0 is a scratch slot that padded positions write into; it is never handed out.
"""

from __future__ import annotations

import torch

from areal.plugins.models.config import DecoderConfig


def bytes_per_token(config: DecoderConfig, dtype: torch.dtype) -> int:
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * element


class TokenKVPool:
    def __init__(
        self, config: DecoderConfig, num_tokens: int, dtype: torch.dtype = torch.float32
    ) -> None:
        if num_tokens < 1:
            raise ValueError(f"the KV cache needs at least one token slot, got {num_tokens}")
        shape = (num_tokens + 1, config.num_key_value_heads, config.head_dim)
        # zeros (not empty) so the whole budget is resident from the start: memory stays flat.
        # One tensor per layer, not one stacked tensor: a compiled decode step writes each
        # layer's slots in place, and a write into a view of one shared tensor would make
        # torch.compile copy the whole pool back every step.
        layers = config.num_hidden_layers
        self.k = [torch.zeros(shape, dtype=dtype) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in range(layers)]
        self.capacity = num_tokens
        self._free = torch.arange(1, num_tokens + 1, dtype=torch.long)
        self._n_free = num_tokens
        self.peak_used = 0  # the most slots held at once: how much of the budget a load needed

    @property
    def free_tokens(self) -> int:
        return self._n_free

    @property
    def used_tokens(self) -> int:
        return self.capacity - self._n_free

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    def alloc(self, n: int) -> torch.Tensor | None:
        """``n`` slot indices, or None when the budget cannot hold them now."""
        if n > self._n_free:
            return None
        start = self._n_free - n
        slots = self._free[start : self._n_free].clone()
        self._n_free = start
        self.peak_used = max(self.peak_used, self.capacity - start)
        return slots

    def release(self, slots: torch.Tensor) -> None:
        n = slots.numel()
        self._free[self._n_free : self._n_free + n] = slots
        self._n_free += n
