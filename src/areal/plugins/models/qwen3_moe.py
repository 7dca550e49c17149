"""Qwen3 mixture-of-experts decoders: Qwen3 attention with routed SwiGLU experts."""

from __future__ import annotations

from areal.plugins.models.decoder import DecoderForCausalLM


class Qwen3MoeForCausalLM(DecoderForCausalLM):
    family = "qwen3_moe"
