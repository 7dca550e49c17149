"""A third-party model family through the same hook as the built-ins: Mistral is Llama-shaped, so a
plugin of a few lines (a config subclass naming the architecture, the Llama module) loads real
Mistral checkpoints with logits equal to transformers'."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
import transformers

from areal.core.hookspecs import hookimpl
from areal.core.plugins import get_plugin_manager
from areal.core.specs import ModelFamily
from areal.plugins.models.config import DecoderConfig
from areal.plugins.models.hf_io import describe, load_model


class MistralConfig(DecoderConfig):
    architectures: ClassVar[dict[str, str]] = {"mistral": "MistralForCausalLM"}


class MistralPlugin:
    @hookimpl
    def areal_register_model_families(self, register: Any) -> None:
        register(
            "mistral",
            ModelFamily(
                name="mistral",
                hf_model_types=("mistral",),
                model_class="areal.plugins.models.llama:LlamaForCausalLM",
                config_class=f"{__name__}:MistralConfig",
            ),
        )


@pytest.fixture
def mistral_plugin() -> Iterator[None]:
    pm = get_plugin_manager()
    plugin = MistralPlugin()
    pm.register(plugin, name="areal-test-mistral")
    try:
        yield
    finally:
        pm.unregister(plugin)


def _mistral_checkpoint(path: Path) -> torch.nn.Module:
    cfg = transformers.MistralConfig(
        vocab_size=211,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=None,
    )
    torch.manual_seed(0)
    model = transformers.MistralForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path)
    return model


def test_plugin_family_loads_mistral(tmp_path: Path, mistral_plugin: None) -> None:
    reference = _mistral_checkpoint(tmp_path)
    ours = load_model(tmp_path)
    assert type(ours.config) is MistralConfig
    ids = torch.randint(0, 211, (2, 23), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), reference(ids).logits, atol=1e-4, rtol=0)
    assert describe(tmp_path)["model_type"] == "mistral"


def test_without_the_plugin_the_error_lists_known_types(tmp_path: Path) -> None:
    _mistral_checkpoint(tmp_path)
    with pytest.raises(
        ValueError, match=r"no model family handles model_type 'mistral'; known: .*qwen3"
    ):
        load_model(tmp_path)
