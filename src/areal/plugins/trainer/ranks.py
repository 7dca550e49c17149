"""The trainer as ``async.train_workers`` ranks: rank 0 drives, the other ranks follow.

Rank 0 runs the whole run of :mod:`areal.run.runner` (processes, queue, trainer loop, metrics,
checkpoints); the followers (:func:`follow`) only hold their shards of the policy and join each
collective rank 0 starts. Every collective is announced by a command, so a follower always knows
which one comes next:

- ``start``: load the policy (and the KL reference), :func:`parallelize` it on the mesh, build
  the optimizer, and on ``--resume`` load the sharded checkpoint (DCP reshards, so another layout
  may resume it);
- ``step``: one :func:`train_step` on the step's samples (every rank gets all of them; the
  :class:`MeshLayout` picks each rank's share);
- ``publish``: gather the full weights to rank 0, into a plain unsharded *shadow* copy that the
  usual weight sync (disk or collective) sends to the engines, as from one process;
- ``save``: every rank writes its shards of model and optimizer (DCP) into the checkpoint;
- ``stop``: return.

Commands travel through the process group's key-value store rather than a collective: a follower
may wait for the next command as long as rollouts keep rank 0 busy (engines starting, a slow
batch), where a collective would time out. The data of a step (its samples) travels with its
command. Collectives time out after ``AREAL_DIST_TIMEOUT_S`` (300 s by default), so a rank that
dies mid-collective fails the others instead of hanging them.
"""

from __future__ import annotations

import datetime
import logging
import os
import pickle
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor

from areal.core.run_config import TrainConfig
from areal.core.train_engine import EngineError, EngineSetup, dist_timeout
from areal.core.types import Sample
from areal.plugins.models.decoder import DecoderForCausalLM
from areal.plugins.models.hf_io import load_model, model_class_for, read_config
from areal.plugins.trainer.parallel.checkpoint import load_distributed, load_hf, save_distributed
from areal.plugins.trainer.parallel.layout import MeshLayout
from areal.plugins.trainer.parallel.parallel_dims import ParallelDims, ParallelMesh
from areal.plugins.trainer.parallel.parallelize import ParallelizeOptions, parallelize
from areal.plugins.trainer.parallel.pipeline import make_layout
from areal.plugins.trainer.step import train_step

log = logging.getLogger("areal.train")

__all__ = [
    "Commands",
    "RankFailure",
    "RankGroup",
    "Ranks",
    "ShardedPolicy",
    "Start",
    "follow",
    "init_ranks",
]


class RankFailure(EngineError):
    """A collective across the trainer ranks failed (a rank died, or timed out)."""


@dataclass
class Ranks:
    """This process's place among the trainer ranks."""

    rank: int
    world: int
    device: torch.device
    mesh: ParallelMesh
    commands: Commands


def init_ranks(setup: EngineSetup) -> Ranks:
    """Join the default process group torchrun described (gloo on CPU, NCCL on GPUs) and build
    the mesh of ``train.parallelism``; every rank calls this first."""
    want = setup.train.device
    on_gpu = want == "cuda" or (want == "auto" and torch.cuda.is_available())
    if on_gpu:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    timeout = datetime.timedelta(seconds=dist_timeout())
    dist.init_process_group("nccl" if on_gpu else "gloo", timeout=timeout)
    dims = ParallelDims.from_config(setup.train.parallelism, world_size=dist.get_world_size())
    mesh = dims.build_mesh(device.type)
    store = dist.PrefixStore("areal/commands/", dist.distributed_c10d._get_default_store())
    rank = dist.get_rank()
    return Ranks(rank, dist.get_world_size(), device, mesh, Commands(store, rank))


class Commands:
    """Rank 0's numbered commands to the followers, through the store (see the module doc)."""

    def __init__(self, store: Any, rank: int) -> None:
        self.store = store
        self.rank = rank
        self.seq = 0

    def send(self, name: str, payload: Any = None) -> None:
        self.store.set(str(self.seq), pickle.dumps((name, payload)))
        if self.seq:  # every follower has read the previous one: it joined this one's collective
            self.store.delete_key(str(self.seq - 1))
        self.seq += 1

    def receive(self) -> tuple[str, Any]:
        key, wait = str(self.seq), 0.001
        while not self.store.check([key]):
            time.sleep(wait)
            wait = min(wait * 2, 0.05)
        self.seq += 1
        name, payload = pickle.loads(self.store.get(key))
        return str(name), payload


@dataclass(frozen=True)
class Start:
    """What every rank loads: the weights, the KL reference (``None``: no KL term), and the
    sharded checkpoint to resume (``None``: a fresh optimizer)."""

    weights_dir: str
    reference_dir: str | None = None
    resume_dir: str | None = None


class ShardedPolicy:
    """This rank's shards of the policy, its optimizer and the step's layout."""

    def __init__(self, ranks: Ranks, setup: EngineSetup, start: Start) -> None:
        self.ranks = ranks
        self.mesh = ranks.mesh
        self.options = ParallelizeOptions.from_config(setup.train)
        dtype = getattr(torch, setup.model.dtype)
        torch.manual_seed(setup.train.seed)
        self.model = self._load(start.weights_dir, dtype).train()
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=setup.train.learning_rate, weight_decay=0.0
        )
        self.reference = None
        if start.reference_dir is not None:
            self.reference = self._load(start.reference_dir, dtype).eval().requires_grad_(False)
        if start.resume_dir is not None:
            load_distributed(start.resume_dir, self.model, self.optimizer)
        self.layout: MeshLayout = make_layout(self.mesh)

    def _load(self, model_dir: str, dtype: torch.dtype) -> DecoderForCausalLM:
        """Only this rank's shards ever reach its device: the model is built on the meta device,
        parallelized there, materialised empty, then filled from the checkpoint files (each
        rank reads them and keeps its shards), as torchtitan does."""
        config = read_config(model_dir)
        with torch.device("meta"):
            model = model_class_for(config)(config)
        if config.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        model = parallelize(model.to(dtype), self.mesh, self.options)
        model.to_empty(device=self.ranks.device)
        model.reset_buffers()
        load_hf(model, model_dir)
        return model

    def step(self, samples: list[Sample], options: dict[str, Any]) -> dict[str, float]:
        return train_step(
            self.model,
            self.optimizer,
            samples,
            layout=self.layout,
            reference=self.reference,
            **options,
        )

    def full_state(self) -> dict[str, Tensor] | None:
        """The full weights on rank 0 (CPU tensors), ``None`` on the other ranks; a collective."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        if not self.mesh.dims.pp_enabled:
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            state: dict[str, Any] = get_model_state_dict(self.model, options=options)
            return state if self.ranks.rank == 0 else None
        # Pipeline stages hold different layers: each stage's first rank sends its full part.
        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))
        state = cast(dict[str, Tensor], state)
        dense = self.mesh.dense
        leader = all(
            dense[d].get_local_rank() == 0 for d in ("dp_replicate", "dp_shard", "cp", "tp")
        )
        mine = {k: v.detach().cpu() for k, v in state.items()} if leader else {}
        parts: list[Any] | None = [None] * self.ranks.world if self.ranks.rank == 0 else None
        dist.gather_object(mine, parts, dst=0)
        if parts is None:
            return None
        return {k: v for part in parts for k, v in part.items()}

    def save(self, path: str, step: int) -> None:
        save_distributed(path, self.model, self.optimizer, step)


class RankGroup:
    """Rank 0's handle on all the ranks: each method announces its command, then takes part.

    :class:`~areal.plugins.trainer.engine.FSDPEngine` drives it on rank 0.
    """

    def __init__(self, ranks: Ranks, setup: EngineSetup, start: Start) -> None:
        self.ranks = ranks
        self.commands = ranks.commands
        self._on_device()
        self.commands.send("start", start)
        self.policy = _collective("start", lambda: ShardedPolicy(ranks, setup, start))
        log.info("%d trainer ranks: %s", ranks.world, describe_layout(setup.train))
        # The unsharded copy the engines are fed from and checkpoints are written from.
        self.shadow = load_model(start.weights_dir, dtype=getattr(torch, setup.model.dtype))
        self.stopped = False

    def step(self, samples: list[Sample], options: dict[str, Any]) -> dict[str, float]:
        """One :func:`train_step` on every rank with ``options`` (the reference is the group's
        own sharded one)."""
        self._on_device()
        self.commands.send("step", (list(samples), options))
        return _collective("step", lambda: self.policy.step(list(samples), options))

    def gather(self) -> DecoderForCausalLM:
        """The newest weights in :attr:`shadow` (every rank takes part)."""
        self._on_device()
        self.commands.send("publish")
        state = _collective("publish", self.policy.full_state)
        assert state is not None
        self.shadow.load_state_dict(state)
        return self.shadow

    def save(self, path: Path, step: int) -> None:
        """The sharded model and optimizer into ``path`` (a DCP directory; every rank writes)."""
        self._on_device()
        self.commands.send("save", (str(path), step))
        _collective("save", lambda: self.policy.save(str(path), step))

    def stop(self) -> None:
        """Followers return; never blocks (a follower stuck in a collective times out)."""
        if not self.stopped:
            self.stopped = True
            self.commands.send("stop")

    def _on_device(self) -> None:
        # Rank 0 calls in from worker threads, and CUDA's current device is per thread.
        if self.ranks.device.type == "cuda":
            torch.cuda.set_device(self.ranks.device)


def describe_layout(train: TrainConfig) -> str:
    """The layout and options the ranks train with, for the run's log."""
    par = train.parallelism
    sizes = [f"{k} {getattr(par, k)}" for k in ("dp", "tp", "pp", "cp") if getattr(par, k) > 1]
    notes = [f"ep {par.ep}"] if par.ep > 1 else []
    if par.dp_replicate > 1:
        notes.append(f"{par.dp_replicate} HSDP replicas")
    if par.pp > 1:
        per_rank = par.pipeline_stages_per_rank
        notes.append(
            par.pipeline_schedule + (f", {per_rank} stages per rank" if per_rank > 1 else "")
        )
    if train.activation_checkpointing:
        notes.append("activation checkpointing")
    if train.compile:
        notes.append("compiled layers")
    notes.append(f"compute in {train.param_dtype}, gradients reduced in {train.reduce_dtype}")
    return f"{' × '.join(sizes) or 'dp 1'} ({'; '.join(notes)})"


def follow(setup: EngineSetup) -> None:
    """A follower's whole life: join the group, then do what rank 0 says until ``stop``."""
    # Ctrl-C is rank 0's to handle: it finishes the step, checkpoints, then says stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ranks = init_ranks(setup)
    policy: ShardedPolicy | None = None
    while True:
        command, payload = ranks.commands.receive()
        if command == "start":
            policy = ShardedPolicy(ranks, setup, payload)
            continue
        if command == "stop":
            break
        if policy is None:
            raise RuntimeError(f"rank {ranks.rank}: {command!r} before 'start'")
        if command == "step":
            samples, options = payload
            policy.step(samples, options)
        elif command == "publish":
            policy.full_state()
        elif command == "save":
            path, step = payload
            policy.save(path, step)
        else:
            raise RuntimeError(f"rank {ranks.rank}: unknown command {command!r}")
    dist.destroy_process_group()


def _collective(what: str, call: Any) -> Any:
    """``call()``, with a failure of the ranks named as such."""
    try:
        return call()
    except (RuntimeError, dist.DistError) as err:
        first = re.sub(r"^\[[^\]]*\]\s*", "", (str(err) or type(err).__name__).splitlines()[0])
        raise RankFailure(
            f"trainer ranks: {what} failed on rank 0 ({first[:160]}); a "
            "follower rank may have died (see its traceback above) or timed out after "
            f"{dist_timeout():.0f}s (AREAL_DIST_TIMEOUT_S)"
        ) from err
