"""The trainer's parallel sizes and the one DeviceMesh they describe (torchtitan's ``ParallelDims``).

The run config's ``train.parallelism`` {dp, tp, pp, cp, ep} (validated against
``async.train_workers`` by :mod:`areal.core.run_config`) becomes one 1-D ``world`` mesh, viewed
two ways by ``DeviceMesh._unflatten`` (each view is a mesh over the same ranks, so sub-meshes of
one view are consistent with each other):

- the **dense** view ``(pp, dp_replicate, dp_shard, cp, tp)``, innermost ``tp`` so tensor-parallel
  collectives stay between neighbouring ranks (one node), with flattened sub-meshes ``dp``
  (replicate × shard: which samples a rank reads), ``dp_shard_cp`` (what FSDP shards over: a
  context-parallel rank holds a different part of each sequence, so it shards the weights like
  another data-parallel rank) and ``dp_cp`` (the loss: valid tokens are counted over all of it);
- the **sparse** view ``(pp, dp_replicate, dp_shard_mod_ep, ep, tp)`` for the routed experts:
  expert parallelism adds no ranks, it takes ``ep`` of the ``dp_shard × cp`` ranks (as torchtitan
  and AReaL fold it), and the experts are FSDP-sharded over what is left (``dp_shard_mod_ep``).

``dp_replicate`` > 1 gives HSDP: ``dp = dp_replicate × dp_shard``, weights sharded within a
replica group and all-reduced across groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["DENSE_DIMS", "SPARSE_DIMS", "ParallelDims"]

DENSE_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
SPARSE_DIMS = ("pp", "dp_replicate", "dp_shard_mod_ep", "ep", "tp")


@dataclass(frozen=True)
class ParallelDims:
    """Validated parallel sizes; :meth:`build_mesh` makes the DeviceMesh (needs a process group)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    dp_replicate: int = 1
    world_size: int = 1

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))

    @classmethod
    def from_config(
        cls, parallelism: Any, world_size: int, *, dp_replicate: int | None = None
    ) -> ParallelDims:
        """From a ``train.parallelism`` section (:class:`~areal.core.run_config.ParallelismConfig`
        or anything with the same attributes) and the number of ranks actually started."""
        replicate = dp_replicate or int(getattr(parallelism, "dp_replicate", 1) or 1)
        return cls(
            dp=parallelism.dp,
            tp=parallelism.tp,
            pp=parallelism.pp,
            cp=parallelism.cp,
            ep=parallelism.ep,
            dp_replicate=replicate,
            world_size=world_size,
        )

    def problems(self) -> list[str]:
        """Each inconsistency as ``key: why; fix`` (the run config reports the same way)."""
        found = []
        for key in ("dp", "tp", "pp", "cp", "ep", "dp_replicate", "world_size"):
            if getattr(self, key) < 1:
                found.append(f"train.parallelism.{key}: must be >= 1; got {getattr(self, key)}")
        if found:
            return found
        product = self.dp * self.tp * self.pp * self.cp
        if product != self.world_size:
            found.append(
                f"train.parallelism: dp×tp×pp×cp = {self.dp}×{self.tp}×{self.pp}×{self.cp} = "
                f"{product} ranks, but {self.world_size} were started; set async.train_workers: "
                f"{product} or change the parallel sizes"
            )
        if self.dp % self.dp_replicate:
            found.append(
                f"train.parallelism.dp_replicate: {self.dp_replicate} does not divide dp "
                f"{self.dp} (dp = dp_replicate × dp_shard); use a divisor of dp"
            )
        elif (self.dp_shard * self.cp) % self.ep:
            found.append(
                f"train.parallelism.ep: {self.ep} does not divide dp_shard×cp = "
                f"{self.dp_shard}×{self.cp} (experts are sharded over the FSDP ranks of one "
                "replica); use a divisor of it"
            )
        return found

    # --- derived sizes -------------------------------------------------------------------------

    @property
    def dp_shard(self) -> int:
        return self.dp // self.dp_replicate

    @property
    def dp_cp(self) -> int:
        """Ranks that see different tokens of the same step: the loss's averaging group."""
        return self.dp * self.cp

    @property
    def dp_shard_mod_ep(self) -> int:
        return self.dp_shard * self.cp // self.ep

    @property
    def fsdp_enabled(self) -> bool:
        return self.dp_shard * self.cp > 1

    @property
    def hsdp_enabled(self) -> bool:
        return self.dp_replicate > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def cp_enabled(self) -> bool:
        return self.cp > 1

    @property
    def ep_enabled(self) -> bool:
        return self.ep > 1

    def describe(self) -> str:
        """``dp=2(replicate 1 × shard 2) tp=2 pp=1 cp=1 ep=1``, for logs and errors."""
        return (
            f"dp={self.dp}(replicate {self.dp_replicate} × shard {self.dp_shard}) tp={self.tp} "
            f"pp={self.pp} cp={self.cp} ep={self.ep}"
        )

    # --- the mesh ------------------------------------------------------------------------------

    def build_mesh(self, device_type: str = "cpu") -> ParallelMesh:
        """The named meshes of this layout; every rank of the default process group calls it."""
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        if not dist.is_initialized():
            raise RuntimeError("ParallelDims.build_mesh needs torch.distributed to be initialised")
        if dist.get_world_size() != self.world_size:
            raise ValueError(
                f"train.parallelism: this layout has {self.world_size} ranks, but the process "
                f"group has {dist.get_world_size()}; start {self.world_size} ranks"
            )
        world = init_device_mesh(device_type, (self.world_size,), mesh_dim_names=("world",))
        dense = world._unflatten(
            0, (self.pp, self.dp_replicate, self.dp_shard, self.cp, self.tp), DENSE_DIMS
        )
        flat = {
            "dp": dense["dp_replicate", "dp_shard"]._flatten("dp"),
            "dp_shard_cp": dense["dp_shard", "cp"]._flatten("dp_shard_cp"),
            "dp_cp": dense["dp_replicate", "dp_shard", "cp"]._flatten("dp_cp"),
        }
        # FSDP's view: dp_shard × cp as one dim, so HSDP gets a 2-D (replicate, shard) mesh.
        fsdp_view = world._unflatten(
            0,
            (self.pp, self.dp_replicate, self.dp_shard * self.cp, self.tp),
            ("pp", "dp_replicate", "dp_shard_cp", "tp"),
        )
        fsdp = (
            fsdp_view["dp_replicate", "dp_shard_cp"] if self.hsdp_enabled else flat["dp_shard_cp"]
        )
        sparse = expert_fsdp = None
        if self.ep_enabled:
            sparse = world._unflatten(
                0, (self.pp, self.dp_replicate, self.dp_shard_mod_ep, self.ep, self.tp), SPARSE_DIMS
            )
            expert_fsdp = (
                sparse["dp_replicate", "dp_shard_mod_ep"]
                if self.hsdp_enabled
                else sparse["dp_shard_mod_ep"]
            )
        return ParallelMesh(
            dims=self,
            world=world,
            dense=dense,
            sparse=sparse,
            flat=flat,
            fsdp=fsdp,
            expert_fsdp=fsdp if expert_fsdp is None else expert_fsdp,
        )


@dataclass(frozen=True)
class ParallelMesh:
    """The meshes of one layout, with the sub-meshes each parallelism uses, by purpose."""

    dims: ParallelDims
    world: DeviceMesh
    dense: DeviceMesh
    sparse: DeviceMesh | None
    flat: dict[str, DeviceMesh]
    fsdp: DeviceMesh  # where FSDP2 shards the dense weights (2-D for HSDP)
    expert_fsdp: DeviceMesh  # where it shards the routed experts (what EP leaves of fsdp)

    def __getitem__(self, name: str) -> DeviceMesh:
        """A 1-D sub-mesh by name (``dp``, ``dp_shard_cp``, ``dp_cp``, ``tp``, ``cp``, ``pp``,
        ``ep`` ...)."""
        if name in self.flat:
            return self.flat[name]
        if name in SPARSE_DIMS and name not in DENSE_DIMS:
            if self.sparse is None:
                raise KeyError(f"mesh dim {name!r} exists only with train.parallelism.ep > 1")
            return self.sparse[name]
        return self.dense[name]

    @property
    def dp_rank(self) -> int:
        """Which share of the samples this rank trains on."""
        return self["dp"].get_local_rank()
