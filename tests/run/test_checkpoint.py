"""Checkpoints: complete or absent, loadable by themselves, pruned, and exact about the data."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from areal.core.run_config import run_config_from_dict
from areal.core.train_engine import EngineSetup
from areal.core.types import Sample, Trajectory
from areal.plugins.models.hf_io import load_model
from areal.plugins.models.tiny import init_tiny
from areal.plugins.trainer.engine import OPTIMIZER_FILE, FSDPEngine, Policy
from areal.run.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    ranges_to_set,
    save_checkpoint,
    set_to_ranges,
)


def test_ranges_round_trip() -> None:
    values = {0, 1, 2, 5, 7, 8}
    assert set_to_ranges(values) == [[0, 3], [5, 6], [7, 9]]
    assert ranges_to_set(set_to_ranges(values)) == values
    assert set_to_ranges([]) == []


def test_save_load_prune(tmp_path: Path) -> None:
    src = tmp_path / "model"
    init_tiny(src, size="nano", seed=0)
    model = load_model(src)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[1, 2, 3]])).sum().backward()
    optimizer.step()
    sample = Sample([1, 2, 3], [0, 1, 1], [0.0, -0.5, -0.25], [-1, 4, 5], reward=0.75)
    pending = [Trajectory("s1", [sample], None, 1, metadata={"group": "task-3", "task_index": 3})]
    out = tmp_path / "run"
    config = run_config_from_dict({"model": {"path": str(src)}, "dataset": {"name": "calculator"}})
    setup = EngineSetup.from_config(config, out)
    engine = FSDPEngine(setup, src, src, policy=Policy.of(model, optimizer))
    for step in (1, 2, 3):
        save_checkpoint(
            out,
            step=step,
            write_engine=lambda tmp, step=step: engine.save(tmp, step),
            state={"loop": {"version": step}},
            pending=pending,
            keep=2,
        )
    # A half-written checkpoint (no state.json) is never "the latest".
    (out / "checkpoints" / "step-000009").mkdir()
    latest = latest_checkpoint(out)
    assert latest is not None and latest.name == "step-000003"
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("step")) == [
        "step-000002",
        "step-000003",
        "step-000009",
    ]
    ckpt = load_checkpoint(latest)
    assert ckpt.step == 3 and ckpt.state["loop"]["version"] == 3
    assert ckpt.pending[0].session_id == "s1" and ckpt.pending[0].samples[0] == sample
    # The model dir stands alone: weights, config and the tokenizer of the source model.
    assert (ckpt.model_dir / "tokenizer.json").is_file()
    reloaded = load_model(ckpt.model_dir)
    for a, b in zip(model.parameters(), reloaded.parameters(), strict=True):
        assert torch.equal(a, b)
    state = torch.load(ckpt.path / OPTIMIZER_FILE, weights_only=True)
    restored = torch.optim.AdamW(reloaded.parameters(), lr=1e-3)
    restored.load_state_dict(state)
    assert restored.state_dict()["state"][0]["step"] == optimizer.state_dict()["state"][0]["step"]


def test_a_truncated_checkpoint_is_skipped_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "run"

    def write_engine(tmp: Path) -> None:
        (tmp / "model").mkdir()
        (tmp / "model" / "model.safetensors").write_bytes(b"x" * 100)

    for step in (1, 2):
        save_checkpoint(out, step=step, write_engine=write_engine, state={}, pending=[])
    newest = out / "checkpoints" / "step-000002"
    assert load_checkpoint(newest).state["files"]["model/model.safetensors"] == 100
    (newest / "model" / "model.safetensors").write_bytes(b"x" * 40)  # a copy cut short
    with caplog.at_level(logging.WARNING, logger="areal.train"):
        assert latest_checkpoint(out) == out / "checkpoints" / "step-000001"
    assert caplog.messages == [
        f"checkpoints: skipping {newest}, it is incomplete (model/model.safetensors has 40 of "
        "100 bytes)"
    ]
    assert newest.is_dir()  # not areal's to delete
