"""ParallelDims: sizes validated against the ranks with errors that name the key; derived sizes;
the mesh itself is built and checked in the multi-process launch (test_mesh.py)."""

from __future__ import annotations

import pytest

from areal.core.run_config import ParallelismConfig
from areal.plugins.trainer.parallel.parallel_dims import ParallelDims


def test_from_config_and_derived_sizes() -> None:
    par = ParallelismConfig(dp=4, tp=2, cp=2, ep=4)
    dims = ParallelDims.from_config(par, world_size=16, dp_replicate=2)
    assert (dims.dp, dims.tp, dims.pp, dims.cp, dims.ep) == (4, 2, 1, 2, 4)
    assert dims.dp_shard == 2
    assert dims.dp_cp == 8
    assert dims.dp_shard_mod_ep == 1  # dp_shard × cp = 4 ranks, all taken by ep
    assert dims.fsdp_enabled and dims.hsdp_enabled and dims.tp_enabled and dims.ep_enabled
    assert not dims.pp_enabled
    assert "replicate 2 × shard 2" in dims.describe()


def test_single_rank_enables_nothing() -> None:
    dims = ParallelDims()
    assert not (dims.fsdp_enabled or dims.tp_enabled or dims.ep_enabled or dims.hsdp_enabled)


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"dp": 2, "tp": 2, "world_size": 8}, ["train.parallelism", "async.train_workers: 4"]),
        ({"dp": 4, "dp_replicate": 3, "world_size": 4}, ["train.parallelism.dp_replicate"]),
        ({"dp": 4, "ep": 3, "world_size": 4}, ["train.parallelism.ep: 3", "dp_shard×cp"]),
        ({"dp": 4, "dp_replicate": 2, "ep": 4, "world_size": 4}, ["train.parallelism.ep: 4"]),
        ({"tp": 0}, ["train.parallelism.tp: must be >= 1"]),
    ],
)
def test_bad_sizes_name_the_key(kwargs: dict[str, int], names: list[str]) -> None:
    with pytest.raises(ValueError) as err:
        ParallelDims(**kwargs)
    message = str(err.value)
    assert "\n" not in message
    for name in names:
        assert name in message


def test_build_mesh_needs_a_process_group() -> None:
    with pytest.raises(RuntimeError, match=r"torch\.distributed"):
        ParallelDims().build_mesh()
