"""Linear layers on oneDNN-packed weights (``packed_linear.py``), q/k/v and gate/up fused: the same
logits as torch's own linear on the same parameters, and a re-pack of exactly the layers whose
weights were written since the last one, whichever way they were written (a stale pack would
answer wrong without any error)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from areal.plugins.inference.embedded import packed_linear
from areal.plugins.inference.embedded.engine import Engine, EngineConfig
from areal.plugins.inference.embedded.packed_linear import (
    PackedLinear,
    PackedWeights,
    can_pack,
    measure_packing,
)
from areal.plugins.models.decoder import DecoderForCausalLM
from areal.plugins.models.hf_io import copy_weights
from areal.plugins.models.tiny import Qwen3ForCausalLM, tiny_config

Linear = torch.nn.Linear

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN")


def _models(**config: bool) -> tuple[DecoderForCausalLM, DecoderForCausalLM, PackedWeights]:
    """An unpacked model and a packed copy of it."""
    model = Qwen3ForCausalLM(dataclasses.replace(tiny_config("nano"), **config))
    model.init_weights(generator=torch.Generator().manual_seed(0))
    packed = copy.deepcopy(model)
    return model.eval(), packed.eval(), PackedWeights(packed)


def _assert_same_logits(a: DecoderForCausalLM, b: DecoderForCausalLM) -> None:
    ids = torch.randint(10, 4000, (3, 11), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        torch.testing.assert_close(b(ids), a(ids), atol=1e-5, rtol=1e-5)


def test_packing_keeps_parameters_and_logits() -> None:
    model, packed_model, packs = _models()
    names = set(model.state_dict())
    params = dict(packed_model.named_parameters(remove_duplicate=False))
    # per layer: q/k/v fused, o, gate/up fused, down; + the LM head
    assert len(packs.layers) == 4 * model.config.num_hidden_layers + 1
    kept = {n.rsplit(".", 1)[-1] for n, m in packed_model.named_modules() if type(m) is Linear}
    assert kept == {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}  # holding parameters
    assert set(packed_model.state_dict()) == names  # same names: weight updates find them
    assert packed_model.lm_head.weight is packed_model.model.embed_tokens.weight  # still tied
    singles = [(n, m) for n, m in _named(packed_model) if not m.fused]
    assert len(singles) == 2 * model.config.num_hidden_layers + 1
    assert all(layer.weight is params[n + ".weight"] for n, layer in singles)
    _assert_same_logits(model, packed_model)


def _named(model: DecoderForCausalLM) -> list[tuple[str, PackedLinear]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, PackedLinear)]


def test_fused_projections_with_biases() -> None:
    """Qwen2's q/k/v carry biases: the fused layer adds their concatenation, re-made with it."""
    model, packed_model, packs = _models(attention_bias=True, mlp_bias=True)
    for m in (model, packed_model):
        with torch.no_grad():
            for name, p in m.named_parameters():
                if name.endswith(".bias"):
                    p.copy_(torch.linspace(-1, 1, p.numel()))
    assert packs.refresh() == 2 * model.config.num_hidden_layers  # q/k/v and gate/up copies
    _assert_same_logits(model, packed_model)
    for m in (model, packed_model):
        with torch.no_grad():
            m.model.layers[1].self_attn.v_proj.bias.mul_(-3.0)
    assert packs.refresh() == 1
    _assert_same_logits(model, packed_model)


def test_refresh_repacks_exactly_the_weights_written() -> None:
    model, packed_model, packs = _models()
    assert packs.refresh() == 0
    g = torch.Generator().manual_seed(2)
    update = {
        name: p + 0.1 * torch.randn(p.shape, generator=g)
        for name, p in model.state_dict().items()
        if name.startswith("model.layers.1.")
    }
    copy_weights(model, update)
    copy_weights(packed_model, update)  # the engine's load_weights
    assert packs.refresh() == 4  # layer 1's q/k/v, o, gate/up and down; nothing else
    assert packs.refresh() == 0
    _assert_same_logits(model, packed_model)


def test_refresh_sees_writes_by_any_path() -> None:
    """In-place ops under no_grad and inference mode, and a parameter given new storage."""
    model, packed_model, packs = _models()
    for m in (model, packed_model):
        with torch.no_grad():
            m.model.embed_tokens.weight.mul_(2.0)  # tied: the LM head's weight
        with torch.inference_mode():
            m.model.layers[0].self_attn.q_proj.weight.add_(0.1)
        new = m.model.layers[1].mlp.up_proj.weight.detach().flip(0).clone()
        m.model.layers[1].mlp.up_proj.weight.data = new
    assert packs.refresh() == 3
    _assert_same_logits(model, packed_model)


def test_only_fp32_cpu_models_are_packed() -> None:
    model = Qwen3ForCausalLM(tiny_config("nano"))
    assert can_pack(model)
    assert not can_pack(model.to(torch.bfloat16))


def test_measuring_packing_times_both_ways_and_changes_nothing() -> None:
    """The start-up measurement times the forward both ways, and leaves the model as it was:
    the same modules, no fused layers set, the same weights and logits."""
    model = Qwen3ForCausalLM(tiny_config("nano"))
    model.init_weights(generator=torch.Generator().manual_seed(0))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    modules = [type(m) for m in model.modules()]
    choice = measure_packing(model, repeats=1, calls=1)
    assert choice.packed_ms > 0 and choice.plain_ms > 0
    assert choice.pays == (choice.packed_ms < choice.plain_ms)
    assert [type(m) for m in model.modules()] == modules
    assert not any(hasattr(m, "qkv_proj") or hasattr(m, "gate_up_proj") for m in model.modules())
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    reference = Qwen3ForCausalLM(tiny_config("nano"))
    reference.init_weights(generator=torch.Generator().manual_seed(0))
    _assert_same_logits(reference.eval(), model.eval())


@pytest.mark.parametrize("pack", [True, False])
def test_a_chosen_packing_is_not_measured(pack: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``pack_weights`` True or False is taken as it is; only the default (None) measures."""

    def must_not_run(*_: object, **__: object) -> None:
        raise AssertionError("measured although the config chose")

    monkeypatch.setattr("areal.plugins.inference.embedded.engine.measure_packing", must_not_run)
    model = Qwen3ForCausalLM(tiny_config("nano"))
    model.init_weights(generator=torch.Generator().manual_seed(0))
    engine = Engine(
        model, lambda ids, skip: "", [], EngineConfig(max_total_tokens=256, pack_weights=pack)
    )
    assert engine.packing == {"packed": pack, "chosen_by": "config"}
    assert (engine._prepacked is not None) == pack


def test_the_default_packs_as_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the default, the engine packs exactly when the measurement says packing pays,
    whichever way it came out on this CPU (both outcomes forced through the real measurement's
    result type)."""
    for packed_ms, plain_ms in ((1.0, 2.0), (2.0, 1.0)):
        choice = packed_linear.PackingChoice(packed_ms, plain_ms)
        monkeypatch.setattr(
            "areal.plugins.inference.embedded.engine.measure_packing", lambda *_a, c=choice: c
        )
        model = Qwen3ForCausalLM(tiny_config("nano"))
        model.init_weights(generator=torch.Generator().manual_seed(0))
        engine = Engine(model, lambda ids, skip: "", [], EngineConfig(max_total_tokens=256))
        assert engine.packing == {**choice.to_json(), "chosen_by": "measured"}
        assert (engine._prepacked is not None) == (packed_ms < plain_ms)
