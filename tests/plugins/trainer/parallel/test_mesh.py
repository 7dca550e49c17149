"""The DeviceMesh of ParallelDims on 4 real ranks: which ranks share each named sub-mesh.

Rank order is (pp, dp_replicate, dp_shard, cp, tp), innermost fastest, so TP groups are
neighbours; EP groups are taken from the dp_shard × cp ranks of one replica.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # multi-rank launches (conftest.py)

EXPECTED: dict[str, dict[str, list[list[int]]]] = {
    "dp2_tp2": {
        "tp": [[0, 1], [0, 1], [2, 3], [2, 3]],
        "dp": [[0, 2], [1, 3], [0, 2], [1, 3]],
        "dp_cp": [[0, 2], [1, 3], [0, 2], [1, 3]],
        "fsdp": [[0, 2], [1, 3], [0, 2], [1, 3]],
    },
    "dp2_cp2": {
        "cp": [[0, 1], [0, 1], [2, 3], [2, 3]],
        "dp": [[0, 2], [1, 3], [0, 2], [1, 3]],
        "dp_cp": [[0, 1, 2, 3]] * 4,
        "dp_shard_cp": [[0, 1, 2, 3]] * 4,
    },
    "hsdp2x2_ep2": {
        "dp": [[0, 1, 2, 3]] * 4,
        "fsdp": [[0, 1, 2, 3]] * 4,  # 2-D: (replicate [0,2]/[1,3]) × (shard [0,1]/[2,3])
        "dp_shard_cp": [[0, 1], [0, 1], [2, 3], [2, 3]],
        "ep": [[0, 1], [0, 1], [2, 3], [2, 3]],
        "expert_fsdp": [[0, 2], [1, 3], [0, 2], [1, 3]],  # replicate × (shard mod ep = 1)
    },
    "dp2_cp2_ep2": {
        "ep": [[0, 1], [0, 1], [2, 3], [2, 3]],
        "expert_fsdp": [[0, 2], [1, 3], [0, 2], [1, 3]],
        "dp_shard_cp": [[0, 1, 2, 3]] * 4,
    },
}


@pytest.mark.parametrize("layout", sorted(EXPECTED))
def test_sub_meshes(launch: Callable[[int], Path], layout: str) -> None:
    seen: list[dict[str, Any]] = json.loads((launch(4) / "meshes.json").read_text())
    for dim, groups in EXPECTED[layout].items():
        assert [sorted(rank[layout][dim]) for rank in seen] == groups, dim
