"""Qwen3 dense decoders: RMSNorm over each head of q and k before RoPE (set from the config)."""

from __future__ import annotations

from areal.plugins.models.decoder import DecoderForCausalLM


class Qwen3ForCausalLM(DecoderForCausalLM):
    family = "qwen3"
