"""The engine's fused q/k/v and gate/up projections compute what the separate ones compute, keep
the checkpoint's parameter names, and follow in-place weight updates (the trainer's pushes)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from areal.plugins.inference.embedded.engine import fuse_projections
from areal.plugins.models.decoder import DecoderForCausalLM
from areal.plugins.models.hf_io import copy_weights
from areal.plugins.models.layers import MLP, Attention
from areal.plugins.models.qwen2 import Qwen2ForCausalLM
from areal.plugins.models.tiny import Qwen3ForCausalLM, tiny_config


def _pair(family: str) -> tuple[DecoderForCausalLM, DecoderForCausalLM]:
    """The same weights twice: one model to fuse, one to keep as the reference."""
    if family == "qwen3":  # q/k norms, no biases
        config, cls = tiny_config("nano"), Qwen3ForCausalLM
    else:  # biases on q, k and v, no norms
        config = dataclasses.replace(
            tiny_config("nano"), model_type="qwen2", qk_norm=False, attention_bias=True
        )
        cls = Qwen2ForCausalLM
    models = []
    for _ in range(2):
        model = cls(config).eval()
        model.init_weights(generator=torch.Generator().manual_seed(0))
        models.append(model)
    with torch.no_grad():  # init leaves biases at 0: make them count
        for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
            if a.dim() == 1 and not a.any():
                a.copy_(torch.randn_like(a, generator=torch.Generator().manual_seed(a.numel())))
                b.copy_(a)
    return models[0], models[1]


@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
def test_fused_projections_equal_the_separate_ones_and_follow_weight_updates(family: str) -> None:
    fused, plain = _pair(family)
    names = list(fused.state_dict())
    fuse_projections(fused)
    assert list(fused.state_dict()) == names  # checkpoints and weight pushes name the same
    assert all(m.qkv is not None for m in fused.modules() if isinstance(m, Attention))
    assert all(m.gate_up is not None for m in fused.modules() if isinstance(m, MLP))
    if family == "qwen2":
        assert all(m.qkv[1] is not None for m in fused.modules() if isinstance(m, Attention))
    ids = torch.randint(0, fused.config.vocab_size, (3, 11))
    with torch.inference_mode():
        torch.testing.assert_close(fused(ids), plain(ids), rtol=1e-5, atol=1e-5)
    # A weight update copies into the modules' parameters: the fused matrices must change too.
    update = {k: v + 0.05 * torch.randn_like(v) for k, v in plain.state_dict().items()}
    copy_weights(fused, update)
    copy_weights(plain, update)
    with torch.inference_mode():
        torch.testing.assert_close(fused(ids), plain(ids), rtol=1e-5, atol=1e-5)
