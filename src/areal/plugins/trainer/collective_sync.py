"""Weight sync by collective broadcast: SGLang's ``/init_weights_update_group`` +
``/update_weights_from_distributed`` protocol, NCCL to SGLang on GPUs, gloo to the embedded engine.

No file system in the path: the trainer (rank 0 of a group it owns with one rank per engine)
broadcasts the weights in buckets while each engine's HTTP call for that bucket is in flight.
The story of one :meth:`CollectiveWeightSync.publish`:

1. **join** (first publish, or after the engines changed): a fresh group — a TCPStore on a port
   the OS picks as it binds, the trainer as rank 0, engine ``i``'s ``tp_size`` ranks from
   ``1 + i * tp_size`` (``/init_weights_update_group``). The store is wrapped and the group formed exactly as SGLang's
   ``init_custom_process_group`` does (:mod:`areal.core.weight_group`), so real SGLang joins.
   The engines of the group it replaces leave that one first (best effort).
2. **gather**: the model's weights as Hugging Face tensors; a sharded model's DTensors are
   gathered in full (``full_tensor()``, a collective every trainer rank joins).
3. **pause**, as the disk sync does (``retract`` or ``in_place``).
4. **update**: bucket by bucket (at most ``bucket_bytes``, one dtype each, sent flattened), every
   engine's ``/update_weights_from_distributed`` call and rank 0's ``broadcast`` run together; the
   last bucket carries ``weight_version``.
5. **continue**.

Weight-sync hangs are the most reported failure of peer projects, so every phase runs under a
watchdog: a stall raises :class:`~areal.plugins.trainer.weight_sync.WeightSyncError` naming the
phase, the bucket and the ranks (engines) that had not answered, instead of hanging. After a
failure the group is re-formed at the next publish (a half-finished broadcast leaves it unusable).

Late joiners. There is no copy of a version to load outside a publish, so an engine that was not
in the group gets the run's weights at the next publish, which re-forms the group with it:

- a (re)started engine of the run (:meth:`catch_up`) serves the weights it was launched with, the
  run's start, until then: before the first publish that is the run's version, and an engine that
  cannot be told its version at launch (vLLM starts as ``"default"``) is labelled with it; after,
  its label is the start version (an old one: the trainer counts its tokens as that stale), or
  ``"default"``, which the trainer never trains (:func:`areal.core.staleness.staleness`);
- an engine attached to the gateway mid-run is in :attr:`engine_urls` from the next publish on
  (:class:`areal.run.supervised_sync.SupervisedSync` asks the gateway), and the gateway holds it,
  taking no traffic, until it serves that version (:mod:`areal.gateway.engine_pool`).
"""

from __future__ import annotations

import asyncio
import datetime
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from areal.core.engine_client import EngineClient, engine_client
from areal.core.inference_records import PauseMode
from areal.core.weight_group import new_weight_group
from areal.plugins.models.decoder import DecoderForCausalLM
from areal.plugins.models.hf_io import to_checkpoint
from areal.plugins.trainer.weight_sync import EngineCalls, WeightSyncError

DEFAULT_BUCKET_BYTES = 64 * 1024**2
GROUP_TIMEOUT_SLACK_S = 5.0  # the group's timeout beyond the watchdog's (see _make_group)


@dataclass
class Bucket:
    names: list[str]
    tensors: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)

    def flat(self, device: torch.device | str) -> torch.Tensor:
        return torch.cat([t.reshape(-1) for t in self.tensors]).to(device)


def hf_tensors(model: DecoderForCausalLM) -> dict[str, torch.Tensor]:
    """The model's weights under checkpoint names, full tensors (tied LM head left out: the
    engine ties it to the embedding itself)."""
    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    full = {}
    for name, tensor in state.items():
        if hasattr(tensor, "full_tensor"):  # a DTensor of a sharded (FSDP/TP) model
            tensor = tensor.full_tensor()
        full[name] = tensor.detach()
    return to_checkpoint(full)


def buckets(tensors: dict[str, torch.Tensor], max_bytes: int) -> list[Bucket]:
    """Tensors in name order, cut into buckets of at most ``max_bytes`` (a bigger tensor gets
    a bucket of its own) and of one dtype each (a flattened bucket has one dtype)."""
    out: list[Bucket] = []
    for name in sorted(tensors):
        tensor = tensors[name]
        size = tensor.numel() * tensor.element_size()
        last = out[-1] if out else None
        if last is None or last.tensors[0].dtype != tensor.dtype or last.nbytes + size > max_bytes:
            out.append(Bucket([], []))
        out[-1].names.append(name)
        out[-1].tensors.append(tensor)
    return out


class CollectiveWeightSync(EngineCalls):
    """Broadcasts the trainer's weights to every engine (see the module docstring)."""

    def __init__(
        self,
        engine_urls: Sequence[str],
        *,
        backend: str = "gloo",
        master_address: str = "127.0.0.1",
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        join_timeout: float = 120.0,
        pause_timeout: float = 60.0,
        update_timeout: float = 300.0,
        continue_timeout: float = 60.0,
        pause_mode: PauseMode = "retract",
        engine_backend: str | None = None,
        tp_size: int = 1,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        """``sleep`` is the watchdog's timer (``asyncio.sleep``; a test passes a fake clock's, to
        say when a phase's timeout has passed)."""
        if tp_size < 1:
            raise ValueError(f"tp_size must be >= 1; got {tp_size}")
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be gloo or nccl; got {backend!r}")
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be >= 1; got {bucket_bytes}")
        timeouts = {
            "join": join_timeout,
            "gather": update_timeout,
            "pause": pause_timeout,
            "update": update_timeout,
            "continue": continue_timeout,
        }
        super().__init__(
            engine_urls, timeouts=timeouts, pause_mode=pause_mode, engine_backend=engine_backend
        )
        self.backend = backend
        self.master_address = master_address
        self.bucket_bytes = bucket_bytes
        self.tp_size = tp_size  # ranks per engine: SGLang joins every tensor-parallel rank
        self._sleep = sleep
        self.device = torch.device("cuda") if backend == "nccl" else torch.device("cpu")
        self._group: Any = None
        self._store: Any = None
        self._group_name = ""
        self._members: tuple[str, ...] = ()
        self._abandoned: list[asyncio.Future[Any]] = []  # rank 0's side of a stalled phase
        self._published = False  # has any version been broadcast (engines moved past the start)?
        self._rejoin = False  # an engine (re)started: the next publish forms a new group

    async def publish(self, model: DecoderForCausalLM, version: int) -> float:
        start = time.perf_counter()
        phases: dict[str, float] = {}
        if self._group is None or self._rejoin or self._members != tuple(self.engine_urls):
            self._rejoin = False
            await self._leave()
            await self._join()
            phases["join"] = time.perf_counter() - start
        mark = time.perf_counter()
        tensors = await self._watch("gather", asyncio.to_thread(hf_tensors, model), None)
        phases["gather"] = time.perf_counter() - mark
        mark = time.perf_counter()
        try:
            await self._pause_all()
            phases["pause"] = time.perf_counter() - mark
            mark = time.perf_counter()
            parts = buckets(tensors, self.bucket_bytes)
            for i, bucket in enumerate(parts):
                last = i == len(parts) - 1
                await self._send(bucket, f"{i + 1}/{len(parts)}", str(version) if last else None)
            phases["update"] = time.perf_counter() - mark
        except WeightSyncError:
            self._group = None  # a broadcast cut short leaves the group unusable: form a new one
            await self._resume_quietly()
            raise
        mark = time.perf_counter()
        self._published = True
        await self._continue_all()
        phases["continue"] = time.perf_counter() - mark
        self.last_phases = phases
        return time.perf_counter() - start

    async def catch_up(self, url: str, version: int) -> None:
        """A (re)started engine is not in the group: form a new one at the next publish. Until
        then it serves the weights it was launched with; before any publish those are
        ``version``, so an engine that cannot be told that at launch (vLLM's ``"default"``)
        is labelled with it (module docstring)."""
        self._rejoin = True
        if self._published:
            return
        client = engine_client(self.engine_backend, url, timeout=self.timeouts["pause"])
        try:
            have = (await client.model_info()).get("weight_version")
            if str(have) != str(version):
                await client.update_weight_version(str(version), abort_all_requests=False)
        finally:
            await client.aclose()

    async def close(self) -> None:
        await self._leave()
        if self._abandoned:  # let a stalled broadcast's thread reach the group's timeout
            await asyncio.wait(
                self._abandoned, timeout=self.timeouts["update"] + GROUP_TIMEOUT_SLACK_S + 5
            )
            for task in self._abandoned:
                if task.done() and not task.cancelled():
                    task.exception()  # retrieved: it is the stall already reported
            self._abandoned.clear()
        self._group = self._store = None
        await super().close()

    # --- the group ----------------------------------------------------------------------------

    async def _leave(self) -> None:
        """The members of the current group leave it (best effort: one may be gone)."""
        if self._group is None:
            return
        name, members, self._group = self._group_name, self._members, None
        await asyncio.gather(
            *(
                self._one("join", u, lambda c: c.destroy_weights_update_group(name))
                for u in members
            ),
            return_exceptions=True,
        )

    async def _join(self) -> None:
        """A new group with every engine: rank 0 here (the store's owner), engine i's ranks
        from ``1 + i * tp_size``."""
        urls = tuple(self.engine_urls)
        name = f"areal-weights-{secrets.token_hex(4)}"
        world = len(urls) * self.tp_size + 1
        store = await asyncio.to_thread(self._new_store, world)
        port = store.port

        def join(rank: int) -> Callable[[EngineClient], Awaitable[dict[str, Any]]]:
            return lambda c: c.init_weights_update_group(
                master_address=self.master_address,
                master_port=port,
                rank_offset=rank,
                world_size=world,
                group_name=name,
                backend=self.backend,
            )

        joins = [
            asyncio.ensure_future(self._one("join", url, join(rank)))
            for rank, url in zip(self._rank_offsets(len(urls)), urls, strict=True)
        ]
        try:
            made = asyncio.to_thread(self._make_group, store, world, name)
            self._group = await self._watch("join", made, joins, urls)
            self._store = store
            for joined in joins:
                await joined
        except BaseException:
            for joined in joins:
                joined.cancel()
            raise
        self._group_name, self._members = name, urls

    def _rank_offsets(self, engines: int) -> list[int]:
        return [1 + i * self.tp_size for i in range(engines)]

    def _group_timeout(self) -> datetime.timedelta:
        """The watchdog's update timeout plus ``GROUP_TIMEOUT_SLACK_S``: a stalled broadcast is
        named by the watchdog (which phase, which bucket, which engine), and the group's timeout
        only ends the abandoned thread afterwards. With equal timeouts, a busy event loop can let
        gloo's bare "timed out" error win the race."""
        return datetime.timedelta(seconds=self.timeouts["update"] + GROUP_TIMEOUT_SLACK_S)

    def _new_store(self, world: int) -> Any:
        """Rank 0's store, on a port the OS picks as it binds (``store.port``), so no other
        process can take the port between a pick and the bind."""
        return dist.TCPStore(
            self.master_address, 0, world, True, timeout=self._group_timeout(),
            wait_for_workers=False,
        )  # fmt: skip

    def _make_group(self, store: Any, world: int, name: str) -> Any:
        """Rank 0's group on its store: SGLang's scheme (NCCL checked by bench/gpu)."""
        return new_weight_group(
            store,
            rank=0,
            world_size=world,
            group_name=name,
            backend=self.backend,
            timeout=self._group_timeout(),
        )

    # --- one bucket ---------------------------------------------------------------------------

    async def _send(self, bucket: Bucket, which: str, version: str | None) -> None:
        """Every engine's call for ``bucket`` and rank 0's broadcast of it, together."""
        names = bucket.names
        dtypes = [str(t.dtype).removeprefix("torch.") for t in bucket.tensors]
        shapes = [list(t.shape) for t in bucket.tensors]
        calls = [
            asyncio.ensure_future(
                self._one(
                    "update",
                    url,
                    lambda c: c.update_weights_from_distributed(
                        names=names,
                        dtypes=dtypes,
                        shapes=shapes,
                        group_name=self._group_name,
                        flush_cache=version is not None,
                        weight_version=version,
                        load_format="flattened_bucket",
                    ),
                )
            )
            for url in self._members
        ]
        group, device = self._group, self.device

        def broadcast() -> None:
            # Flattened here, off the event loop, which meanwhile sends the engines' calls.
            group.broadcast(bucket.flat(device), 0).wait()

        try:
            await self._watch("update", asyncio.to_thread(broadcast), calls, which=which)
            for call in calls:
                await call
        except BaseException:
            for call in calls:
                call.cancel()
            raise

    async def _watch(
        self,
        phase: str,
        work: Any,
        calls: Sequence[asyncio.Future[None]] | None,
        urls: Sequence[str] | None = None,
        *,
        which: str = "",
    ) -> Any:
        """``work`` (rank 0's side) under the phase's timeout; an engine call that fails first
        is raised as it is; a stall names the engines that had not answered. An engine call
        that timed out (its own timeout is the phase's too) is one that has not answered: which
        of the two timers fires first is chance, the error is the watchdog's either way."""
        timeout = self.timeouts[phase]
        task = asyncio.ensure_future(work)
        timer = asyncio.ensure_future(self._sleep(timeout))
        pending: set[asyncio.Future[Any]] = {task, timer, *(calls or [])}
        try:
            while not task.done() and not timer.done():
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for finished in done:
                    pending.discard(finished)
                    failed = finished not in (task, timer) and finished.exception() is not None
                    if failed and not _timed_out(finished):
                        raise finished.exception()  # type: ignore[misc]
        finally:
            timer.cancel()
        if not task.done():
            self._abandoned.append(task)  # its thread ends at the group's timeout; close() waits
            members = list(urls or self._members)
            offsets = self._rank_offsets(len(members))
            waiting = [
                i
                for i, call in enumerate(calls or [])
                if (not call.done() or _timed_out(call)) and i < len(members)
            ]
            bucket = f" of bucket {which}" if which else ""
            who = ", ".join(f"rank {offsets[i]} ({members[i]})" for i in waiting)
            raise WeightSyncError(
                phase,
                members[waiting[0]] if waiting else None,  # the engine a supervisor may restart
                f"rank 0 (the trainer) stalled {timeout:g} s in the {phase}{bucket}; "
                f"not answered: {who or 'no engine call was pending'}",
                stalled=bool(waiting),
            )
        return task.result()


def _timed_out(call: asyncio.Future[Any]) -> bool:
    """Did this engine call end by its own timeout (no answer), rather than by an error?"""
    exc = call.exception() if call.done() and not call.cancelled() else None
    return isinstance(exc, WeightSyncError) and exc.stalled
