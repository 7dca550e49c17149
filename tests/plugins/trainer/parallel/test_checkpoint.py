"""Checkpoints of a sharded model, from the 4-rank launch: DCP saved in one layout resumes in
another bit for bit (model and AdamW state): dense dp2×tp2 -> dp4, MoE dp4×ep2 -> dp2×cp2×ep4,
pipelined dp2×pp2 -> dp4. HF safetensors exported from the dp4 model load back bit-identical, by
``hf_io.load_model`` and into a dp2×tp2 model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from areal.plugins.models.hf_io import load_model

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("kind", ["dense", "moe", "untied"])
def test_dcp_resumes_in_another_layout(launch: Callable[[int], Path], kind: str) -> None:
    got = torch.load(launch(4) / f"ckpt-{kind}.pt")
    saved, resumed = got["saved"], got["resumed"]
    assert got["step"] == 7
    assert saved["params"].keys() == resumed["params"].keys()
    for name, tensor in saved["params"].items():
        assert torch.equal(resumed["params"][name], tensor), name
    tied = {"lm_head.weight"} if kind == "dense" else set()  # one parameter, one state
    assert set(saved["optim"]) == set(saved["params"]) - tied
    assert saved["optim"].keys() == resumed["optim"].keys()
    for name, state in saved["optim"].items():
        assert set(state) == {"step", "exp_avg", "exp_avg_sq"}
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(resumed["optim"][name][key]), torch.as_tensor(value))


def test_hf_export_of_sharded_model_is_bit_identical(launch: Callable[[int], Path]) -> None:
    out = launch(4)
    saved = torch.load(out / "ckpt-dense.pt")["saved"]["params"]
    exported = load_model(out / "hf").state_dict()
    for name, tensor in saved.items():
        assert torch.equal(exported[name], tensor), name
    loaded = torch.load(out / "hf_loaded.pt")["params"]
    for name, tensor in saved.items():
        assert torch.equal(loaded[name], tensor), name
