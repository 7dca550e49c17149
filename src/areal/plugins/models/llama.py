"""Llama 2 / 3 dense decoders."""

from __future__ import annotations

from areal.plugins.models.decoder import DecoderForCausalLM


class LlamaForCausalLM(DecoderForCausalLM):
    family = "llama"
