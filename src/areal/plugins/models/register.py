"""Built-in model families, registered through the same hook as third-party ones."""

from __future__ import annotations

from areal.core.hookspecs import Register, hookimpl
from areal.core.specs import ModelFamily

_PKG = "areal.plugins.models"

BUILTIN_FAMILIES = (
    ModelFamily(
        name="llama",
        hf_model_types=("llama",),
        model_class=f"{_PKG}.llama:LlamaForCausalLM",
        config_class=f"{_PKG}.config:DecoderConfig",
        description="Llama 2/3 dense decoders (llama3 RoPE scaling included)",
    ),
    ModelFamily(
        name="qwen2",
        hf_model_types=("qwen2",),
        model_class=f"{_PKG}.qwen2:Qwen2ForCausalLM",
        config_class=f"{_PKG}.config:DecoderConfig",
        description="Qwen2 / Qwen2.5 dense decoders (q/k/v bias)",
    ),
    ModelFamily(
        name="qwen3",
        hf_model_types=("qwen3",),
        model_class=f"{_PKG}.qwen3:Qwen3ForCausalLM",
        config_class=f"{_PKG}.config:DecoderConfig",
        description="Qwen3 dense decoders (q/k RMSNorm)",
    ),
    ModelFamily(
        name="qwen3_moe",
        hf_model_types=("qwen3_moe",),
        model_class=f"{_PKG}.qwen3_moe:Qwen3MoeForCausalLM",
        config_class=f"{_PKG}.config:DecoderConfig",
        description="Qwen3 mixture-of-experts decoders",
    ),
)


@hookimpl
def areal_register_model_families(register: Register) -> None:
    for family in BUILTIN_FAMILIES:
        register(family.name, family)
