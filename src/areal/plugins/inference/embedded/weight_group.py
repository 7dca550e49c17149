"""The engine's side of SGLang's collective weight sync, over gloo on CPU.

``/init_weights_update_group`` joins a process group that lives outside any torch.distributed
default world (the trainer is rank 0 and owns the TCPStore), formed as SGLang forms it
(``PrefixStore(group_name, store)``, :mod:`areal.core.weight_group`), so one trainer serves both;
``/update_weights_from_distributed`` then receives each tensor by ``broadcast`` from rank 0 while
the HTTP call is in flight, exactly as a trainer does with SGLang over NCCL. Receiving happens off the engine thread; only the final copy
into the model runs between decode steps.
"""

from __future__ import annotations

import datetime
import threading
from typing import Any

import torch
import torch.distributed as dist

from areal.core.weight_group import new_weight_group, receive_tensors
from areal.plugins.inference.embedded.requests import RequestError


class WeightUpdateGroups:
    """Named gloo groups this engine has joined (one rank per engine: no tensor parallelism)."""

    def __init__(self, timeout_s: float = 120.0) -> None:
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self._groups: dict[str, Any] = {}  # name -> dist.ProcessGroupGloo
        self._lock = threading.Lock()

    def init_group(
        self,
        *,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str,
    ) -> None:
        if backend != "gloo":
            raise RequestError(
                f"backend {backend!r} needs GPUs; the embedded engine joins with 'gloo'"
            )
        if not 0 < rank_offset < world_size:
            raise RequestError(f"rank_offset {rank_offset} must be in [1, world_size={world_size})")
        with self._lock:
            if group_name in self._groups:
                raise RequestError(f"weight update group {group_name!r} already exists")
        store = dist.TCPStore(master_address, master_port, world_size, False, timeout=self.timeout)
        group = new_weight_group(
            store,
            rank=rank_offset,
            world_size=world_size,
            group_name=group_name,
            backend=backend,
            timeout=self.timeout,
        )
        with self._lock:
            self._groups[group_name] = group

    def receive(
        self,
        *,
        group_name: str,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        flattened: bool,
    ) -> dict[str, torch.Tensor]:
        """Tensors broadcast by rank 0, in the order of ``names`` (or one flat bucket)."""
        group = self._get(group_name)
        if len(names) != len(shapes):
            raise RequestError("names, dtypes and shapes must have the same length")
        try:
            tensors = receive_tensors(group, dtypes=dtypes, shapes=shapes, flattened=flattened)
        except ValueError as err:  # bad metadata, found before anything was received
            raise RequestError(str(err)) from err
        # A flat bucket's views are copied out, so the model holds no view of the bucket.
        return {n: t.clone() if flattened else t for n, t in zip(names, tensors, strict=True)}

    def destroy(self, group_name: str) -> None:
        with self._lock:
            group = self._groups.pop(group_name, None)
        if group is None:
            raise RequestError(f"no weight update group named {group_name!r}")

    def _get(self, group_name: str) -> Any:
        with self._lock:
            group = self._groups.get(group_name)
        if group is None:
            raise RequestError(
                f"no weight update group named {group_name!r}; call /init_weights_update_group first"
            )
        return group
