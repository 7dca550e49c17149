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
against SGLang's own function. torch is imported only here, when a group is made.
"""

from __future__ import annotations

import datetime
from typing import Any


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
