"""Qwen2 / Qwen2.5 dense decoders: Llama plus biases on q/k/v (set from the config)."""

from __future__ import annotations

from areal.plugins.models.decoder import DecoderForCausalLM


class Qwen2ForCausalLM(DecoderForCausalLM):
    family = "qwen2"
