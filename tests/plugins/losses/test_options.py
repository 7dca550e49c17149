"""Loss options: names checked against the loss's signature with the key and the fix in the
error, the typed ``algorithm`` fields reaching only the losses that name them, the probe call
that checks values; every registered loss takes the one signature."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch

from areal.core.loss_options import LOSS_INPUTS, call_options, ignored_typed, option_defaults
from areal.core.plugins import make_plugin_manager, registry
from areal.plugins.losses.sapo import sapo_loss
from areal.plugins.trainer.loss_probe import probe_loss

LOSSES = ("decoupled_ppo", "ppo", "sapo", "cispo")
TYPED = {"eps_clip": 0.2, "eps_clip_high": None, "behavior_weight_cap": None}


def test_unknown_option_names_the_key_and_a_close_match() -> None:
    with pytest.raises(ValueError) as err:
        call_options(sapo_loss, loss="sapo", options={"tau_nge": 2.0, "loss_mask": 1})
    lines = str(err.value).splitlines()
    assert lines[0].startswith("algorithm.loss_options.tau_nge: loss 'sapo' has no option")
    assert "did you mean tau_neg?" in lines[0] and "its options: tau_pos, tau_neg" in lines[0]
    assert lines[1].startswith("algorithm.loss_options.loss_mask: loss_mask is an input")


def test_typed_fields_reach_only_the_losses_that_name_them() -> None:
    losses = registry("losses", make_plugin_manager(load_entry_points=False))
    dppo = losses.get("decoupled_ppo").load()
    sapo = losses.get("sapo").load()
    typed = {**TYPED, "behavior_weight_cap": 3.0}
    assert call_options(dppo, loss="decoupled_ppo", typed=typed, options={"c_clip": 2.0}) == {
        "eps_clip": 0.2,
        "behavior_weight_cap": 3.0,
        "c_clip": 2.0,
    }
    # loss_options win over the typed field's default; sapo takes the cap but not eps_clip.
    opts = call_options(sapo, loss="sapo", typed=typed, options={"behavior_weight_cap": 4.0})
    assert opts == {"behavior_weight_cap": 4.0}
    assert ignored_typed(sapo, loss="sapo", explicit={"eps_clip"}) == [
        "algorithm.eps_clip: loss 'sapo' has no option 'eps_clip', so it is ignored (its "
        "options: " + ", ".join(option_defaults(sapo) or {}) + ")"
    ]
    with pytest.raises(ValueError, match=r"algorithm\.eps_clip: also set as"):
        call_options(
            dppo, loss="decoupled_ppo", typed=TYPED, explicit={"eps_clip"}, options={"eps_clip": 1}
        )


def test_a_loss_without_the_inputs_is_named() -> None:
    def bad(*, logprobs: torch.Tensor, scale: float = 1.0) -> None:
        del logprobs, scale

    with pytest.raises(ValueError, match=r"algorithm\.loss: loss 'bad' does not take the input"):
        call_options(bad, loss="bad")


def test_the_probe_checks_values_and_learns_the_statistics() -> None:
    assert probe_loss(sapo_loss, {}, loss="sapo") == [
        "ratio_mean",
        "approx_kl",
        "behavior_weight_mean",
        "cap_masked_fraction",
        "gate_mean",
    ]
    with pytest.raises(ValueError, match=r"algorithm\.loss_options: loss 'sapo' refused"):
        probe_loss(sapo_loss, {"tau_neg": -1.0}, loss="sapo")

    def no_count(**_: Any) -> tuple[torch.Tensor, dict[str, float]]:
        return torch.zeros(()), {}

    with pytest.raises(ValueError, match="n_valid_tokens"):
        probe_loss(no_count, {}, loss="x")


@pytest.mark.parametrize("name", LOSSES)
def test_every_registered_loss_takes_the_one_signature(name: str) -> None:
    fn = registry("losses", make_plugin_manager(load_entry_points=False)).get(name).load()
    params = inspect.signature(fn).parameters
    assert list(params)[: len(LOSS_INPUTS)] == list(LOSS_INPUTS)
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())
    assert probe_loss(fn, {}, loss=name)  # runs on packed [N] with cu_seqlens
