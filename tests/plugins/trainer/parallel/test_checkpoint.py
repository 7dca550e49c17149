"""Checkpoints of a sharded model, from the 4-rank launch: DCP saved in one layout resumes in
another bit for bit (model and AdamW state, and every rank's hyperparameters): dense dp2×tp2 ->
dp4, MoE dp4×ep2 -> dp2×cp2×ep4, pipelined dp2×pp2 -> tp2×pp2, and a tied LM head out of a
pipeline (tp2×pp2 -> dp4; its copy on the last stage saved under the embedding's name). HF safetensors exported from the dp4 model load back bit-identical, by
``hf_io.load_model`` and into a dp2×tp2 model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from areal.plugins.models.hf_io import load_model

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # multi-rank launches (conftest.py)


@pytest.mark.parametrize("case", ["dense", "moe", "untied", "tied_out_of_pp"])
def test_dcp_resumes_in_another_layout(launch: Callable[[int], Path], case: str) -> None:
    got = torch.load(launch(4) / f"ckpt-{case}.pt")
    saved, resumed = got["saved"], got["resumed"]
    assert got["step"] == 7
    assert saved["params"].keys() == resumed["params"].keys()
    for name, tensor in saved["params"].items():
        assert torch.equal(resumed["params"][name], tensor), name
    if case != "moe" and case != "untied":  # one tied matrix: one state (two copies under pp)
        for view in (saved, resumed):
            head = view["optim"].pop("lm_head.weight", None)  # the last stage's copy
            if head is not None:
                embedding = view["optim"]["model.embed_tokens.weight"]
                assert all(torch.equal(head[k], embedding[k]) for k in embedding)
        tied = {"lm_head.weight"}
    else:
        tied = set()
    assert set(saved["optim"]) == set(saved["params"]) - tied
    assert saved["optim"].keys() == resumed["optim"].keys()
    for name, state in saved["optim"].items():
        assert set(state) == {"step", "exp_avg", "exp_avg_sq"}
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(resumed["optim"][name][key]), torch.as_tensor(value))
    # Each rank's AdamW keeps its hyperparameters: a pipeline stage once lost them on resume (its
    # group was saved by index, as another stage's), and the next step failed on 'betas'.
    for rank_groups in resumed["groups"]:
        for group in rank_groups:
            assert (group["lr"], group["betas"], group["eps"]) == (1e-3, (0.9, 0.999), 1e-8)


def test_hf_export_of_sharded_model_is_bit_identical(launch: Callable[[int], Path]) -> None:
    out = launch(4)
    saved = torch.load(out / "ckpt-dense.pt")["saved"]["params"]
    exported = load_model(out / "hf").state_dict()
    for name, tensor in saved.items():
        assert torch.equal(exported[name], tensor), name
    loaded = torch.load(out / "hf_loaded.pt")["params"]
    for name, tensor in saved.items():
        assert torch.equal(loaded[name], tensor), name


def test_a_checkpoint_of_an_earlier_areal_still_resumes(tmp_path: Path) -> None:
    """DCP checkpoints saved before the optimizer state was flattened (groups by index) load as
    they were saved, hyperparameters and state; the new format round-trips too."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from areal.plugins.models.qwen3 import Qwen3ForCausalLM
    from areal.plugins.models.tiny import tiny_config
    from areal.plugins.trainer.parallel.checkpoint import load_distributed, save_distributed

    def trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        model = Qwen3ForCausalLM(tiny_config("nano"))
        model.init_weights(generator=torch.Generator().manual_seed(0))
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.8, 0.95))
        for p in model.parameters():
            p.grad = torch.full_like(p, 0.1)
        optimizer.step()
        return model, optimizer

    model, optimizer = trained()
    model_state, optim_state = get_state_dict(model, optimizer)  # the earlier format
    dcp.save(
        {"model": model_state, "optim": optim_state, "step": 4}, checkpoint_id=tmp_path / "old"
    )
    save_distributed(tmp_path / "new", model, optimizer, 5)
    for name, step in (("old", 4), ("new", 5)):
        fresh = Qwen3ForCausalLM(tiny_config("nano"))
        fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1.0)
        assert load_distributed(tmp_path / name, fresh, fresh_optimizer) == step
        (group,) = fresh_optimizer.param_groups
        assert (group["lr"], group["betas"]) == (3e-4, (0.8, 0.95)), name
        for key, value in optimizer.state_dict()["state"].items():
            got = fresh_optimizer.state_dict()["state"][key]
            assert torch.equal(got["exp_avg"], value["exp_avg"]), (name, key)
        assert torch.equal(fresh.lm_head.weight, model.lm_head.weight)
