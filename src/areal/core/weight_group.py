"""The process group of a collective weight sync, formed key for key as SGLang forms it.

SGLang's receiver (``sglang.srt.utils.common.init_custom_process_group``) wraps the TCPStore it
reaches at ``tcp://master_address:master_port`` as ``PrefixStore(group_name, store)`` and hands it
to torch's ``_new_process_group_helper``, which prefixes it again with ``f"{group_name}/"`` and,
with ``f"{device}/"`` for the backend's first device (gloo: cpu; nccl: cuda; one backend serves
them all), makes the backend there and sets its sequence number through the store. Every rank must take
the same steps on the same keys, so the trainer (rank 0, the store's owner) and the embedded
engine both call :func:`new_weight_group`. It builds the backends itself instead of calling the
helper, which would register ``group_name`` in torch's per-process registry: a trainer and an
embedded engine in one process (the tests) would then collide. tests/plugins/trainer checks it
against SGLang's own function. :func:`receive_tensors` is a receiving rank's side of one
bucket. torch is imported only in these functions, when a group is made or used. This file
imports nothing of areal's: vLLM's workers load it by its path (areal's vLLM worker extension).
"""

from __future__ import annotations

import datetime
from typing import Any

WEIGHT_DTYPES = ("float32", "float16", "bfloat16", "float64")  # what a bucket may carry


def new_weight_group(
    store: Any,
    *,
    rank: int,
    world_size: int,
    group_name: str,
    backend: str,
    timeout: datetime.timedelta,
) -> Any:
    """This rank's side of the group: a ``ProcessGroupGloo`` or ``ProcessGroupNCCL``."""
    from torch.distributed import distributed_c10d as c10d

    prefixed = c10d.PrefixStore(f"{group_name}/", c10d.PrefixStore(group_name, store))
    # One backend serves every device (gloo: cpu and cuda): torch makes it once, for the first.
    device, name = next(
        iter(c10d.BackendConfig(c10d.Backend(backend)).get_device_backend_map().items())
    )
    device_store = c10d.PrefixStore(f"{device}/", prefixed)
    group: Any
    if name == c10d.Backend.GLOO:
        group = c10d.ProcessGroupGloo(device_store, rank, world_size, timeout=timeout)
    elif name == c10d.Backend.NCCL:
        options = c10d.ProcessGroupNCCL.Options()
        options.is_high_priority_stream = False
        options._timeout = timeout
        group = c10d.ProcessGroupNCCL(device_store, rank, world_size, options)
    else:
        raise ValueError(f"no weight group over {name!r}; use gloo or nccl")
    group._set_sequence_number_for_group()
    return group


def receive_tensors(
    group: Any,
    *,
    dtypes: list[str],
    shapes: list[list[int]],
    flattened: bool,
    device: Any = None,
) -> list[Any]:
    """The tensors rank 0 broadcasts to ``group``, in order: one flat bucket of one dtype
    (``flattened``), or one broadcast per tensor. ``ValueError`` names bad metadata before
    anything is received."""
    import torch

    if len(dtypes) != len(shapes):
        raise ValueError("dtypes and shapes must have the same length")
    names = [d.removeprefix("torch.") for d in dtypes]
    unknown = sorted(set(names) - set(WEIGHT_DTYPES))
    if unknown:
        raise ValueError(
            f"dtypes {unknown} are not supported; use one of {', '.join(WEIGHT_DTYPES)}"
        )
    types = [getattr(torch, name) for name in names]
    if not flattened:
        tensors = [
            torch.empty(s, dtype=t, device=device) for t, s in zip(types, shapes, strict=True)
        ]
        for tensor in tensors:
            group.broadcast(tensor, 0).wait()
        return tensors
    if len(set(types)) > 1:
        raise ValueError("a flattened bucket needs one dtype for all tensors")
    numels = [int(torch.Size(s).numel()) for s in shapes]
    buffer = torch.empty(sum(numels), dtype=types[0] if types else torch.float32, device=device)
    group.broadcast(buffer, 0).wait()
    return [part.view(s) for part, s in zip(buffer.split(numels), shapes, strict=True)]
