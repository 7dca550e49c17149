"""The KL-to-reference option: per-sample k1 sums by hand, and the reward they lower."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from areal.core.types import Sample
from areal.plugins.models.hf_io import load_model
from areal.plugins.models.tiny import init_tiny
from areal.plugins.trainer.packing import pack
from areal.plugins.trainer.step import reference_kl, token_logprobs, train_step


@pytest.fixture(scope="module")
def nano(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("kl") / "nano"
    init_tiny(path, size="nano", seed=0)
    return path


def samples_with_offsets(model: torch.nn.Module, offsets: list[float]) -> list[Sample]:
    """Samples whose behaviour log-probs are the model's own plus a known offset per token."""
    out = []
    for i, delta in enumerate(offsets):
        ids = [1, 10 + i, 20 + i, 30 + i, 40 + i]
        mask = [0, 0, 1, 1, 1]
        probe = Sample(ids, mask, [0.0] * 5, [-1, -1, 0, 0, 0])
        lp = token_logprobs(model, pack([probe])[0]).tolist()  # lp[t] scores token t+1
        logprobs = [0.0, 0.0] + [lp[t - 1] + delta for t in (2, 3, 4)]
        out.append(Sample(ids, mask, logprobs, [-1, -1, 0, 0, 0], reward=1.0))
    return out


def test_reference_kl_sums_each_samples_generated_tokens(nano: Path) -> None:
    model = load_model(nano)
    with torch.no_grad():
        samples = samples_with_offsets(model, [0.0, 0.5, -0.25])
    kl = reference_kl(model, [pack(samples)], len(samples))
    # Three generated tokens each: 3 × offset (the reference is the model itself).
    torch.testing.assert_close(kl, torch.tensor([0.0, 1.5, -0.75]), atol=1e-5, rtol=0)


def test_kl_coef_lowers_rewards_before_the_advantages(nano: Path) -> None:
    model, reference = load_model(nano), load_model(nano)
    with torch.no_grad():
        samples = samples_with_offsets(model, [0.0, 0.5])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    without = train_step(
        model, optimizer, samples, mini_batch_size=2, group_ids=[0, 0], current_version=0
    )
    with_kl = train_step(
        model,
        optimizer,
        samples,
        mini_batch_size=2,
        group_ids=[0, 0],
        current_version=0,
        kl_coef=0.1,
        reference=reference,
    )
    # Equal rewards: no advantage, no loss. With the penalty the sample that drifted from the
    # reference (KL 1.5) scores 0.15 lower, so the two get opposite advantages.
    assert without["loss"] == 0.0 and without["kl_ref"] == 0.0
    assert with_kl["kl_ref"] == pytest.approx(1.5 / 6, abs=1e-5)
    assert with_kl["loss"] != 0.0
    with pytest.raises(ValueError, match="reference model"):
        train_step(
            model,
            optimizer,
            samples,
            mini_batch_size=2,
            group_ids=[0, 0],
            current_version=0,
            kl_coef=0.1,
        )
