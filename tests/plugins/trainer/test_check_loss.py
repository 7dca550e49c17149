"""The engine checks ``algorithm.loss`` and its options from the run config before anything slow,
with the key and the fix in the error; the options reach :func:`train_step`."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from areal.core.run_config import load_run_config
from areal.core.train_engine import EngineError, EngineSetup
from areal.plugins.trainer.engine import check_loss, step_options

QUICKSTART = Path(__file__).parents[3] / "configs" / "quickstart.yaml"


def setup_of(tmp_path: Path, *overrides: str) -> EngineSetup:
    config = load_run_config(QUICKSTART, overrides)
    return EngineSetup.from_config(config, tmp_path)


def test_the_loss_and_its_options_reach_the_step(tmp_path: Path) -> None:
    setup = setup_of(
        tmp_path,
        "algorithm.loss=sapo",
        "algorithm.loss_options={tau_neg: 1.2}",
        "algorithm.advantage_options={normalize_std: false}",
        "algorithm.advantage_norm=batch",
        "algorithm.prox_logp=loglinear_every_minibatch",
    )
    check_loss(setup)
    options = step_options(setup)
    assert options["prox_logp"] == "loglinear_every_minibatch"
    assert options["loss"] == "sapo" and options["loss_options"] == {"tau_neg": 1.2}
    assert options["advantage_options"] == {"normalize_std": False}
    assert options["advantage_norm"] == "batch"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algorithm.loss=sapo", "algorithm.loss_options={tau_nge: 2}"],
            "algorithm.loss_options.tau_nge: loss 'sapo' has no option 'tau_nge'; did you mean "
            "tau_neg?",
        ),
        (
            ["algorithm.loss_options={c_clip: 0.5}"],
            "algorithm.loss_options: loss 'decoupled_ppo' refused its options: c_clip",
        ),
        (
            ["algorithm.advantage_options={normalise_std: false}"],
            "algorithm.advantage_options.normalise_std: advantage 'grpo' has no option",
        ),
        (
            ["algorithm.loss_options={eps_clip: 0.3}"],  # quickstart sets algorithm.eps_clip
            "algorithm.eps_clip: also set as algorithm.loss_options.eps_clip; keep one",
        ),
        (
            [
                "algorithm.loss_options={importance_sampling_level: sequence}",
                "train.parallelism.cp=2",
                "async.train_workers=2",
            ],
            "algorithm.loss_options.importance_sampling_level: sequence level needs whole",
        ),
        (
            [
                "algorithm.loss_options={importance_sampling_level: sequence_mean_adv}",
                "train.parallelism.cp=2",
                "async.train_workers=2",
            ],
            "algorithm.loss_options.importance_sampling_level: sequence level needs whole",
        ),
        (
            [
                "algorithm.loss_options={loss_agg_mode: seq-mean-token-mean}",
                "train.parallelism.cp=2",
                "async.train_workers=2",
            ],
            "algorithm.loss_options.loss_agg_mode: seq-mean-token-mean averages each sequence, "
            "but train.parallelism.cp 2 splits sequences over ranks; use loss_agg_mode "
            "token-mean or cp: 1",
        ),
    ],
)
def test_bad_options_are_one_line_naming_the_key(
    tmp_path: Path, overrides: list[str], message: str
) -> None:
    with pytest.raises(EngineError) as err:
        check_loss(setup_of(tmp_path, *overrides))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_typed_field_the_loss_does_not_take_is_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="areal.train"):
        check_loss(setup_of(tmp_path, "algorithm.loss=sapo"))  # quickstart sets eps_clip
    assert "algorithm.eps_clip: loss 'sapo' has no option 'eps_clip', so it is ignored" in (
        caplog.text
    )


def test_the_discount_is_per_turn_and_never_gae_s_per_token_gamma(tmp_path: Path) -> None:
    setup = setup_of(tmp_path, "algorithm.advantage=gae", "algorithm.discount=0.9")
    assert step_options(setup)["advantage_options"] == {}  # γ = λ = 1 per token
    told = setup_of(
        tmp_path, "algorithm.advantage=gae", "algorithm.advantage_options={gamma: 0.99}"
    )
    assert step_options(told)["advantage_options"] == {"gamma": 0.99}
    with pytest.raises(ValueError, match=r"algorithm.advantage_options.lam and .gamma"):
        setup_of(tmp_path, "algorithm.gae_lambda=0.95")
    with pytest.raises(EngineError, match="token_returns is an input the trainer passes"):
        check_loss(setup_of(tmp_path, "algorithm.advantage_options={token_returns: 1}"))
