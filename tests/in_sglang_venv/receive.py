"""Run inside the SGLang venv: one SGLang rank of a weight-update group, joined with SGLang's own
``init_custom_process_group`` exactly as its weight updater calls it (``init_method`` tcp://, the
rank ``rank_offset + tp_rank``), then receiving one broadcast from rank 0 the way the updater
does (``torch.distributed.broadcast(..., group=...)``). Prints the tensor it got as JSON.

Usage: receive.py MASTER_ADDRESS MASTER_PORT WORLD_SIZE RANK GROUP_NAME NUMEL
"""

from __future__ import annotations

import datetime
import json
import sys

import torch
import torch.distributed as dist
from sglang.srt.utils.common import init_custom_process_group


def main() -> None:
    address, port, world, rank, name, numel = sys.argv[1:7]
    group = init_custom_process_group(
        backend="gloo",
        init_method=f"tcp://{address}:{port}",
        world_size=int(world),
        rank=int(rank),
        group_name=name,
        timeout=datetime.timedelta(seconds=60),
    )
    tensor = torch.zeros(int(numel), dtype=torch.float32)
    dist.broadcast(tensor, src=0, group=group)
    print(json.dumps({"rank": int(rank), "tensor": tensor.tolist()}), flush=True)
    # As SGLang's ``destroy_weights_update_group`` does: a group left to the interpreter's exit
    # once aborted the process ("terminate called without an active exception", gloo's thread).
    dist.destroy_process_group(group)


if __name__ == "__main__":
    main()
