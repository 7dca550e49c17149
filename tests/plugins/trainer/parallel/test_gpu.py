"""GPU-only paths on one device: FSDP2 with the bf16 mixed-precision policy and compiled layers,
over NCCL, track the fp32 eager step (bf16 rounding allows ~1e-2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from support import dist_worker as worker

pytestmark = pytest.mark.gpu


def test_bf16_compiled_fsdp_step_tracks_fp32(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import torch.distributed as dist

    from areal.plugins.trainer.parallel.parallel_dims import ParallelDims
    from areal.plugins.trainer.parallel.parallelize import (
        ParallelizeOptions,
        apply_compile,
        apply_fsdp,
    )
    from areal.plugins.trainer.parallel.pipeline import make_layout
    from areal.plugins.trainer.step import train_step

    reference = worker.build_model().cuda()
    samples, groups = worker.build_samples(reference.cpu())
    reference.cuda()
    optimizer = torch.optim.SGD(reference.parameters(), lr=worker.LR)
    expected = train_step(reference, optimizer, samples, group_ids=groups, **worker.STEP_ARGS)

    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        mesh = ParallelDims().build_mesh("cuda")
        model = worker.build_model().cuda()
        apply_compile(model)
        options = ParallelizeOptions(param_dtype="bfloat16", reduce_dtype="float32")
        apply_fsdp(model, mesh.fsdp, options)
        optimizer = torch.optim.SGD(model.parameters(), lr=worker.LR)
        got = train_step(
            model,
            optimizer,
            samples,
            group_ids=groups,
            layout=make_layout(mesh),
            **worker.STEP_ARGS,
        )
    finally:
        dist.destroy_process_group()
    assert got["n_valid_tokens"] == expected["n_valid_tokens"]
    assert got["loss"] == pytest.approx(expected["loss"], abs=2e-2)
    assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=5e-2)
