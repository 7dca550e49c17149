"""One RL train step under dp (FSDP2), tp, cp, ep, pp and their combinations (dp×tp, dp×cp,
tp×cp, dp×ep, dp×cp×ep, dp×pp, tp×pp, cp×pp, dp×pp×ep), HSDP, activation checkpointing and four
pipeline schedules, on real gloo ranks, against the same step in one process: loss and updated
parameters agree to 1e-5. The dense layouts train the nano Qwen3 (tied embeddings), the ``moe_``
ones its Qwen3-MoE twin, the ``untied_`` ones (pipelines) the nano with an untied LM head.

The optimizer is SGD so that parameters differ exactly by lr × the gradients' difference: Adam's
first steps divide each gradient element by its own size, which turns fp32 rounding differences
of near-zero gradients into differences of the learning rate's order.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from areal.plugins.trainer.step import train_step

pytestmark = pytest.mark.slow

_spec = importlib.util.spec_from_file_location(
    "dist_worker", Path(__file__).with_name("dist_worker.py")
)
assert _spec is not None and _spec.loader is not None
worker: Any = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)


@pytest.fixture(scope="module")
def references() -> dict[str, dict[str, Any]]:
    """The single-process step of each model kind (dense, moe, untied)."""
    torch.set_num_threads(1)
    out = {}
    for kind in ("dense", "moe", "untied"):
        model = worker.build_model(kind=kind)
        samples, groups = worker.build_samples(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=worker.LR)
        stats = train_step(model, optimizer, samples, group_ids=groups, **worker.STEP_ARGS)
        out[kind] = {"stats": stats, "params": worker.full_parameters(model)}
    return out


@pytest.mark.parametrize(
    ("world", "layout"),
    [(world, name) for world, layouts in worker.LAYOUTS.items() for name in layouts],
)
def test_step_matches_single_process(
    launch: Callable[[int], Path],
    references: dict[str, dict[str, Any]],
    world: int,
    layout: str,
) -> None:
    kind = worker.model_kind(layout)
    reference = references[kind]
    got = torch.load(launch(world) / f"{layout}.pt")
    ref = reference["stats"]
    assert got["stats"]["n_valid_tokens"] == ref["n_valid_tokens"]
    assert got["stats"]["n_tokens"] == ref["n_tokens"]
    assert got["stats"]["n_minibatches"] == ref["n_minibatches"] == 2
    assert got["stats"]["loss"] == pytest.approx(ref["loss"], abs=1e-5)
    assert got["stats"]["clip_fraction"] == pytest.approx(ref["clip_fraction"], abs=1e-6)
    assert got["stats"]["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4)
    assert got["params"].keys() == reference["params"].keys()
    for name, expected in reference["params"].items():
        torch.testing.assert_close(got["params"][name], expected, atol=1e-5, rtol=0, msg=name)
    # With TP the LM head is sharded along the vocabulary and its log-probs are loss-parallel.
    assert got["vocab_sharded"] == ("tp2" in layout)
    # The step did move the weights (the comparison is not between two untouched models).
    moe = kind == "moe"
    name = "model.layers.0.mlp.experts.up_proj" if moe else "model.layers.0.mlp.up_proj.weight"
    before = worker.build_model(kind=kind).state_dict()[name]
    assert (got["params"][name] - before).abs().max() > 1e-3
