"""``areal train``: one asynchronous RL run, from a run config to trained checkpoints.

The story of :func:`train`, top to bottom (:meth:`_Run.main`: build → start → loop → stop):

0. **The model** (:func:`~areal.core.model_source.resolve_models`): a Hugging Face Hub id in
   ``model.path`` becomes its snapshot in the local cache (downloaded once unless
   ``HF_HUB_OFFLINE``), so the trainer and every engine start from the same directory.
1. **Build** (:meth:`_Run.build`): the training engine ``train.engine`` names (registered
   through ``areal_register_engines``; the built-in ``fsdp``), handed the config sections it
   owns; it prepares the policy (areal's tiny model if asked, the cached format warm start) and,
   with ``--resume``, takes the newest checkpoint's weights and optimizer, while the run takes
   its counters, data position and buffered trajectories. Then the trajectory queue, the
   engine's weight sync, the supervised processes, the metric sinks and the trainer loop.
2. **Start** (:meth:`_Run.start`): the processes, each supervised (restarted when it dies, up to
   a limit) and healthy before the next stage: the inference engines (serving the policy), the
   gateway (the agents' endpoint; finished episodes go to the trainer's ZeroMQ queue; new
   episodes are admitted under the staleness budget), the rollout workers (the agent once per
   task sample).
3. **Loop** (:meth:`_Run.loop`): trajectories in, one engine step per batch, every new version
   published to the engines and announced to the gateway's staleness clock; ``[train]``,
   ``[rollout]``, ``accounting`` and ``sync`` events to the metric sinks (a ``run`` event first,
   an ``end`` event last, for the live monitor); a checkpoint every ``logging.save_interval``
   steps.
4. **Stop** (``max_steps``, Ctrl-C / SIGTERM, the caller's ``stop`` event, or a process beyond
   saving): rollout workers stop first, the queue is drained into the trainer's buffer, a final
   checkpoint keeps it, then the gateway and the engines stop. A dead process ends the run with
   :class:`RunError` naming it.

Under torchrun (``async.train_workers > 1``, started by :mod:`.launch`) this is rank 0 and the
engine spreads the policy over all ranks; the run is the same. The run never imports torch: all
of it is behind the engine (:mod:`areal.core.train_engine`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal.core.launcher import launcher_for
from areal.core.metrics import MetricsHub, MetricValue, make_metric_sink
from areal.core.model_source import ModelSourceError, resolve_models
from areal.core.plugins import registry
from areal.core.queue import make_source
from areal.core.registry import RegistryError
from areal.core.run_config import RunConfig
from areal.core.train_engine import (
    EngineError,
    EngineSetup,
    TrainEngine,
    WeightSync,
    WeightSyncError,
)
from areal.core.types import Trajectory
from areal.gateway.router_config import RouterConfig
from areal.host.event_loop import EventLoopChoiceError, loop_choice
from areal.host.footprint import disk_bytes, human_bytes, merged, tree_peaks
from areal.run.accounting import JOURNAL_NAME, EpisodeLedger, consumed
from areal.run.attached_gateway import AttachedGateway, AttachError
from areal.run.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    ranges_to_set,
    recover_checkpoints,
    save_checkpoint,
    set_to_ranges,
)
from areal.run.gateway_client import GatewayAdmin, best_effort
from areal.run.leftovers import LeftoverProcesses, RunProcesses
from areal.run.loop import Published, TrainerLoop
from areal.run.observe import ArrivalWindow, ObservedSource
from areal.run.processes import (
    engine_child,
    gateway_child,
    gateway_training_flags,
    router_config,
    run_sampling,
    worker_child,
)
from areal.run.supervised_sync import SupervisedSync, gateway_engines
from areal.run.supervisor import Child, ChildFailed, Supervisor
from areal.run.trainer_thread import TrainerThread

log = logging.getLogger("areal.train")

GATEWAY_KEY_ENV = "AREAL_GATEWAY_KEY"  # the key plain calls (online agents) need

__all__ = ["RunError", "RunSummary", "train"]


class RunError(RuntimeError):
    """The run cannot start or go on; the message says which part and why."""


@dataclass
class RunSummary:
    """What :func:`train` did (also written to ``{output_dir}/summary.json``)."""

    steps: int
    version: int
    history: list[dict[str, float]]
    counters: dict[str, int]
    checkpoint: str | None
    seconds: float
    stopped_by: str  # "max_steps", "signal" or "requested" (the caller's ``stop`` event)
    restarts: dict[str, int] = field(default_factory=dict)
    # The run's footprint, for sizing the next one: the peak RSS of the trainer process and of
    # every process it started (each one's peak, summed; taken before they stop), and the bytes
    # of one checkpoint on disk, of which ``logging.keep_checkpoints`` are kept.
    peak_rss_bytes: int | None = None
    processes: int | None = None
    checkpoint_bytes: int | None = None
    keep_checkpoints: int | None = None

    def footprint(self) -> str:
        """``peak RSS 1.9 GiB (5 processes, ...); one checkpoint 12.3 MiB; ...`` (empty when
        nothing was measured: a run that never got to its end)."""
        parts = []
        if self.peak_rss_bytes is not None:
            parts.append(
                f"peak RSS {human_bytes(self.peak_rss_bytes)} ({self.processes} processes, "
                "each one's peak summed)"
            )
        if self.checkpoint_bytes is not None and self.keep_checkpoints is not None:
            each, keep = self.checkpoint_bytes, self.keep_checkpoints
            parts.append(
                f"one checkpoint {human_bytes(each)}; logging.keep_checkpoints {keep} keeps "
                f"≤ {human_bytes(each * keep)} ({human_bytes(each * (keep + 1))} while a save "
                "commits)"
            )
        return "; ".join(parts)


def train(
    config: RunConfig,
    output_dir: str | Path,
    *,
    resume: bool = False,
    stop: threading.Event | None = None,
) -> RunSummary:
    """Run ``config`` to ``train.max_steps`` (see the module docstring); blocks until done.

    ``stop``, set from any thread, ends the run as a first Ctrl-C does: after the current step,
    with the final checkpoint, ``stopped_by="requested"``. A program that runs :func:`train` on
    a thread of its own (signals reach only the main thread) stops it this way.

    A Hub id in ``model.path`` becomes its local snapshot first (a no-op when the entry point
    resolved it already), so the trainer and every engine start from one directory."""
    try:
        loop_choice()  # the gateway and the workers read it: a bad value fails the run here
        config = resolve_models(config)
    except (ModelSourceError, EventLoopChoiceError) as err:
        raise RunError(str(err)) from err
    return asyncio.run(_Run(config, Path(output_dir), resume, stop).main())


@dataclass
class _Parts:
    """What :meth:`_Run.build` puts together for one run."""

    engine: TrainEngine
    source: Any  # the trajectory queue's consuming end
    sync: WeightSync
    supervisor: Supervisor
    gateway: GatewayAdmin
    metrics: MetricsHub
    observed: ObservedSource
    loop: TrainerLoop


class _Run:
    """One run's state; :meth:`main` is the story of the module docstring."""

    def __init__(
        self,
        config: RunConfig,
        output_dir: Path,
        resume: bool,
        stop: threading.Event | None = None,
    ) -> None:
        self.config = config
        self.out = output_dir
        self.log_dir = config.logging.directory(output_dir)
        self.run_dir = output_dir / "run"
        self.resume = resume
        self.version = 0
        self.seen_tasks: set[int] = set()
        self.publish_lock = asyncio.Lock()
        # Read between steps; set by a signal (on the loop) or by the caller (any thread).
        self.stop = stop if stop is not None else threading.Event()
        self.stopped_by = "max_steps"
        self.rollout_step = 0
        self._rollout_window: list[Trajectory] = []
        self._window_samples = 0  # samples and trained tokens of _rollout_window
        self._window_tokens = 0
        self._arrivals = ArrivalWindow()
        self.hub: MetricsHub | None = None
        self.ledger = EpisodeLedger(self.run_dir / JOURNAL_NAME, fresh=not resume)
        self.members = RunProcesses(self.run_dir)  # this run's pids, for the next start to check
        self._loop: TrainerLoop | None = None  # for the gateway's budget, once built
        self._queue: Any = None
        # For the live monitor: episodes received per rollout worker, generated tokens of each
        # received trajectory until it is trained, and the supervisor (restart counts).
        self.worker_episodes: dict[str, int] = {}
        self._tokens_of: dict[str, int] = {}
        self.tokens_trained = 0
        self.supervisor: Supervisor | None = None
        self.engine: TrainEngine | None = None
        self.trainer_thread = TrainerThread()  # builds, steps and saves the engine, in order
        self.last_saved = 0  # the step of the newest checkpoint
        # agent.gateway_url: the gateway that runs on its own and this run attaches to.
        self.attached: AttachedGateway | None = None
        self.sync: WeightSync | None = None

    # --- the story ---------------------------------------------------------------------------

    async def main(self) -> RunSummary:
        """build → start → loop → stop; a part that fails ends the run with :class:`RunError`."""
        started = time.perf_counter()
        try:
            run = await self.build()
        except BaseException:
            self.members.release()  # nothing of this run is left to find
            self.trainer_thread.close()
            raise
        self.install_signal_handlers()
        history: list[dict[str, float]] = []
        checkpoint_path, failure = None, ""
        peaks: dict[int, int] = {}
        try:
            await self.start(run)
            history = await self.loop(run)
            peaks = tree_peaks()  # while every process of the run still runs
            checkpoint_path = await self.drain_and_save(run)
            peaks = merged(peaks, tree_peaks())  # the final save's peak in this process
        except (EngineError, WeightSyncError) as exc:  # a trainer rank, or a sync no restart mends
            failure = str(exc)
            raise RunError(failure) from exc
        except BaseException as exc:
            failure = str(exc) or type(exc).__name__
            raise
        finally:
            await self.stop_all(run, failure)
        loop = run.loop
        summary = RunSummary(
            steps=loop.state_dict()["steps"],
            version=loop.version,
            history=history,
            counters=loop.counters(),
            checkpoint=checkpoint_path,
            seconds=time.perf_counter() - started,
            stopped_by=self.stopped_by,
            restarts={c.name: c.restarts for c in run.supervisor.children if c.restarts},
            peak_rss_bytes=sum(peaks.values()) if peaks else None,
            processes=len(peaks) if peaks else None,
            checkpoint_bytes=disk_bytes(checkpoint_path) if checkpoint_path else None,
            keep_checkpoints=self.config.logging.keep_checkpoints,
        )
        _write_summary(self.out / "summary.json", summary)
        return summary

    # --- 1. build ----------------------------------------------------------------------------

    async def build(self) -> _Parts:
        """The engine (from the checkpoint on ``--resume``), the queue, the weight sync, the
        supervised processes (not started yet), the metric sinks and the trainer loop."""
        config = self.config
        if config.train.cpu_affinity:
            # Before the first worker thread: Linux pins the calling thread, and threads (the one
            # that runs the train step included) inherit the mask of the thread that creates them.
            os.sched_setaffinity(0, set(config.train.cpu_affinity))
        for d in (self.out, self.log_dir, self.run_dir):
            d.mkdir(parents=True, exist_ok=True)
        try:  # a leftover of an earlier run on this directory would write into this one's files
            self.members.claim()
        except LeftoverProcesses as err:
            raise RunError(str(err)) from None
        online = config.agent.online.enabled and not config.agent.gateway_url
        if online and not os.environ.get(GATEWAY_KEY_ENV):  # before the engine's minutes, too
            raise RunError(
                f"agent.online.enabled: online agents call the run's gateway with the key in "
                f"{GATEWAY_KEY_ENV}, which is not set; export {GATEWAY_KEY_ENV}=<a key of your "
                "choosing> here and give the agents the same"
            )
        if config.agent.gateway_url:  # before the engine's minutes: a wrong URL fails at once
            try:
                self.attached = AttachedGateway.from_env(
                    config.agent.gateway_url, backend=config.inference.backend
                )
                await self.attached.check()
            except AttachError as err:
                raise RunError(str(err)) from err
        for stale in self.run_dir.glob("rollout*.progress.json"):
            stale.unlink()  # progress files only carry restarts within one run
        checkpoint = None
        recover_checkpoints(self.out)  # what a save killed midway left behind
        if self.resume:
            found = latest_checkpoint(self.out)
            if found is None:
                raise RunError(f"--resume: no checkpoint under {self.out / 'checkpoints'}")
            checkpoint = load_checkpoint(found)
            self.version = int(checkpoint.state["loop"]["version"])
            self.seen_tasks = ranges_to_set(checkpoint.state["data"]["seen"])
            log.info("resuming from %s (step %d)", found, checkpoint.step)

        # The training engine, with the sections it owns (minutes, with a warm start to run).
        threads = _threads(config)
        setup = EngineSetup.from_config(
            config, self.out, threads=threads, resume_from=checkpoint.path if checkpoint else None
        )
        try:
            build = registry("engines").get(config.train.engine, key="train.engine").load_build()
            engine: TrainEngine = await self.trainer_thread.run(build, setup)
        except (EngineError, RegistryError) as err:
            raise RunError(str(err)) from err
        self.engine = engine

        source = make_source(
            "zmq",
            {
                "address": f"tcp://{setup.listen_address}:*",
                "queue_max_size": config.async_.queue_max_size,
                "on_receipt": self.ledger.received,
            },
        )
        sync = self.sync = engine.weight_sync(self.out / "weights")
        supervisor, gateway = self.processes(
            str(engine.weights_dir), source.address, sync, threads, checkpoint_start(checkpoint)
        )
        self.supervisor = supervisor
        metrics = self.hub = self.metrics()
        observed = ObservedSource(source, self.observe, config.async_.queue_max_size)
        loop = TrainerLoop(
            engine,
            observed,
            SupervisedSync(
                sync,
                supervisor,
                self.publish_lock,
                # Engines others attached to the gateway (the run's own, or the one it attached
                # to) get every publish too, under every sync.
                others=gateway_engines(gateway),
            ),
            trigger_batch_size=config.async_.trigger_batch_size,
            global_batch_size=config.train.global_batch_size,
            staleness_threshold=config.async_.staleness_threshold,
            async_enabled=config.async_.enabled,
            metrics=metrics,
            start_version=self.version,
            kl_penalty=bool(config.algorithm.kl_coef),
            group_wait_s=config.async_.group_wait_s,
            success_reward=success_reward(config),
            buffer_max=config.async_.queue_max_size,
            overlap_sync=config.async_.overlap_sync,
            trainer_thread=self.trainer_thread,
        )
        if checkpoint:
            # This run's gateway is new: the earlier run's open sessions end with no tombstone.
            loop.restore(checkpoint.state["loop"], checkpoint.pending, more_members=False)
        self._loop, self._queue = loop, source
        self.last_saved = loop.state_dict()["steps"]
        return _Parts(engine, source, sync, supervisor, gateway, metrics, observed, loop)

    # --- 2. start ----------------------------------------------------------------------------

    async def start(self, run: _Parts) -> None:
        """Engines, then the gateway, then the rollout workers, each healthy before the next.
        Attached to a running gateway: its trainer seat first, then the engines register there."""
        config, first_step = self.config, run.loop.state_dict()["steps"]
        run.metrics.write("run", first_step, self.run_values())
        if self.attached is not None:
            await self.take_seat(self.attached, run.source.address)
        try:
            await run.supervisor.start_all()
        except ChildFailed as err:
            raise RunError(f"a process of the run did not start: {err}") from err
        if self.attached is not None:
            await self.announce(run.gateway)
            self.attached.start_heartbeat(lambda: self.announce(run.gateway))
        log.info(
            "run started: %d engine(s), gateway %s, %d rollout worker(s); step %d -> %d",
            config.inference.engines,
            run.gateway.url,
            config.async_.rollout_workers,
            first_step,
            config.train.max_steps,
        )
        if config.agent.online.enabled:
            log.info(
                "online agents: base URL %s/v1 (Anthropic: %s), key $%s; rate a conversation "
                'with POST %s/rl/conversations/{id}/end {"reward": R}',
                run.gateway.url,
                run.gateway.url,
                GATEWAY_KEY_ENV,
                run.gateway.url,
            )

    # --- 3. loop -----------------------------------------------------------------------------

    async def loop(self, run: _Parts) -> list[dict[str, float]]:
        """Train to ``train.max_steps`` (or a signal, or the caller's ``stop``) while the
        supervisor keeps every process alive; a process beyond saving ends the run."""
        remaining = self.config.train.max_steps - run.loop.state_dict()["steps"]

        async def on_step(result: dict[str, float]) -> None:
            await self.after_step(run, result)

        async def on_batch() -> None:
            await self.end_abandoned(run)

        async def on_published(published: Published) -> None:
            await self.published(run, published)

        training = asyncio.create_task(
            run.loop.run(
                remaining,
                stop=self.stop,
                on_step=on_step,
                on_batch=on_batch,
                on_published=on_published,
            )
        )
        watching = asyncio.create_task(run.supervisor.watch())
        done, _ = await asyncio.wait({training, watching}, return_when=asyncio.FIRST_COMPLETED)
        if watching in done:
            training.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await training
            error = watching.exception()
            raise RunError(f"the run lost a process: {error}") from error
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
        history = training.result()
        if len(history) < remaining and self.stopped_by == "max_steps":
            self.stopped_by = "requested"  # stopped early, and by no signal: by the caller
        return history

    async def end_abandoned(self, run: _Parts) -> None:
        """The sessions of the members still to come of groups the batch about to train takes
        without them, ended at the gateway: their calls are cut, the engines stop generating
        tokens the loop would drop as late."""
        for members in run.loop.take_abandoned():
            await best_effort(run.gateway.discard(metadata=members))

    async def published(self, run: _Parts, published: Published) -> None:
        """The engines serve a new version: it goes to the gateway's clock (only now, so that
        no episode is admitted for weights not yet served) and into a ``sync`` event."""
        self.version = published.version
        await self.announce(run.gateway)
        values = _sync_values(published, run.sync.last_phases, run.loop.overlap_sync)
        run.metrics.write("sync", published.step, values)

    async def after_step(self, run: _Parts, result: dict[str, float]) -> None:
        """The audit trail, the ``accounting`` event, and every ``logging.save_interval`` steps
        a checkpoint (the engines may still be loading this step's weights: the checkpoint does
        not need them to)."""
        loop = run.loop
        self.audit(loop)
        step = int(result["step"])
        await self.account(run.gateway, run.observed, loop, run.metrics)
        if step % self.config.logging.save_interval == 0:
            await self.trainer_thread.run(self.save, loop)
            self.last_saved = step

    # --- 4. stop -----------------------------------------------------------------------------

    async def drain_and_save(self, run: _Parts) -> str | None:
        """No new episodes; what reached the queue goes into the final checkpoint."""
        for child in run.supervisor.children:
            if child.name.startswith("rollout") and child.process is not None:
                child.up = False
                await asyncio.to_thread(child.process.stop, 5.0)
        if self.attached is not None:  # while the queue still takes the gateway's last words
            await self.attached.leave()
        run.source.close()
        drained = 0
        while (trajectory := run.source.get(timeout=0)) is not None:
            self.observe(trajectory)
            run.loop.add(trajectory)
            drained += 1
        # Saved again when the queue held trajectories, even at a step just saved: the final
        # checkpoint keeps them (re-saving a step replaces it crash-safely).
        steps = run.loop.state_dict()["steps"]
        if drained or steps != self.last_saved or not latest_checkpoint(self.out):
            return str(await self.trainer_thread.run(self.save, run.loop))
        found = latest_checkpoint(self.out)
        return str(found) if found else None

    async def stop_all(self, run: _Parts, failure: str) -> None:
        """The engine's ranks, the gateway's seat (an attached run leaves the gateway running),
        every process, the queue and the sync; the ``end`` event last."""
        run.engine.stop()
        self.trainer_thread.close()
        if self.attached is not None:
            await self.attached.leave()
        await asyncio.to_thread(run.supervisor.stop_all)
        self.members.release()
        run.source.close()
        await run.sync.close()
        end: dict[str, MetricValue] = {
            "stopped_by": self.stopped_by,
            "version": run.loop.version,
            "error": failure,
        }
        run.metrics.write("end", run.loop.state_dict()["steps"], end)
        run.metrics.close()

    # --- the processes --------------------------------------------------------------------

    def processes(
        self,
        weights_dir: str,
        queue_address: str,
        sync: WeightSync,
        threads: int,
        data: tuple[int, list[list[int]]],
    ) -> tuple[Supervisor, GatewayAdmin]:
        config, attached = self.config, self.attached
        supervisor = Supervisor(on_spawn=self.note_pid, launcher=launcher_for(config))
        if attached is not None:  # the gateway's own secrets, from the environment
            admin_token = attached.admin.admin_token
            gateway_key: str | None = os.environ.get(GATEWAY_KEY_ENV)
        else:
            admin_token = secrets.token_urlsafe(24)
            # Online agents were given the key beforehand (checked in build); else any will do.
            gateway_key = os.environ.get(GATEWAY_KEY_ENV) if config.agent.online.enabled else None
            gateway_key = gateway_key or secrets.token_urlsafe(24)

        served_at: dict[str, str] = {}  # engine name -> the url the gateway has for it
        # An engine (re)starts from weights_dir, the run's start: labelled with that version (not
        # the current one), so its catch-up sees it behind and its tokens never claim newer weights.
        start_version = self.version

        async def catch_up(child: Child) -> None:
            """A (re)started engine gets the trainer's newest weights if it is behind; attached to
            a running gateway, it then takes the gateway's traffic. An engine that came back at
            another address (on another node) moves in the weight sync and the run's gateway."""
            url = child.url or ""
            sync.engine_urls = [e.url or "" for e in engines]
            async with self.publish_lock:
                await sync.catch_up(url, self.version)
            if attached is not None:
                await attached.register(child)
            elif served_at.get(child.name, url) != url:
                await best_effort(gateway.detach_engine(served_at[child.name], drain=False))
                await gateway.attach_engine(url, backend=config.inference.backend)
            served_at[child.name] = url

        async def leave_gateway(child: Child) -> None:
            if attached is not None:
                await attached.unregister(child)

        engines = [
            supervisor.add(
                engine_child(
                    config,
                    i,
                    model_dir=lambda: weights_dir,
                    version=lambda: start_version,
                    log_dir=self.log_dir,
                    threads=threads,
                    after_start=catch_up,
                    before_restart=leave_gateway,
                )
            )
            for i in range(config.inference.engines)
        ]
        sync.engine_urls = [e.url or "" for e in engines]

        async def announce(child: Child) -> None:
            await self.announce(gateway)

        if attached is not None:
            gateway = attached.admin
            model_id = attached.policy_model
        else:
            gateway, model_id = self.gateway(
                supervisor, engines, queue_address, admin_token, gateway_key or "", announce
            )

        async def discard_sessions(child: Child) -> None:
            """A crashed worker's open episodes will never end: give their slots back."""
            worker = child.name.removeprefix("rollout")
            await best_effort(gateway.discard(metadata={"worker": worker}))

        start, skip = data
        for i in range(config.async_.rollout_workers):
            supervisor.add(
                worker_child(
                    config,
                    i,
                    gateway_url=lambda: gateway.url,
                    model_id=model_id,
                    run_dir=self.run_dir,
                    log_dir=self.log_dir,
                    admin_token=admin_token,
                    gateway_key=gateway_key,
                    start=start,
                    skip=skip,
                    before_restart=discard_sessions,
                )
            )
        return supervisor, gateway

    def note_pid(self, child: Child) -> None:
        self.members.record(child.name, child.process.pid if child.process else None)

    def gateway(
        self,
        supervisor: Supervisor,
        engines: list[Child],
        queue_address: str,
        admin_token: str,
        gateway_key: str,
        announce: Callable[[Child], Awaitable[None]],
    ) -> tuple[GatewayAdmin, str]:
        """The run's own gateway, supervised (no ``agent.gateway_url``), and the policy's id."""
        config = self.config
        gateway_proc, gateway = gateway_child(
            config,
            router=router_config(config, self.run_dir),
            engine_urls=lambda: [e.url or "" for e in engines],
            queue_address=queue_address,
            version=lambda: self.version,
            log_dir=self.log_dir,
            admin_token=admin_token,
            gateway_key=gateway_key,
            after_start=announce,
            consumed=self.consumed,
            journal=self.ledger.journal,
        )
        supervisor.add(gateway_proc)
        return gateway, _policy_model_id(config)

    async def take_seat(self, attached: AttachedGateway, queue_address: str) -> None:
        """The running gateway's trainer seat, with the settings the run's own gateway would have
        been started with: its queue, its staleness budget (from the run's totals on), its
        discount, its episode journal and its sampling."""
        received, dropped = self.consumed()
        flags = gateway_training_flags(
            self.config,
            queue_address,
            self.version,
            consumed=received,
            dropped=dropped,
            journal=self.ledger.journal,
        )
        try:
            await attached.take_seat(**flags.to_seat(), sampling=run_sampling(self.config))
        except AttachError as err:
            raise RunError(str(err)) from err

    # --- the trainer's side ---------------------------------------------------------------

    def consumed(self) -> tuple[int, int]:
        """(episodes received, dropped as stale) in all of the run (0, 0 before the build)."""
        if self._loop is None:
            return 0, 0
        return consumed(self._loop, self._queue)

    async def announce(self, gateway: GatewayAdmin) -> None:
        """The version and the run's totals to the gateway's budget: after every step and every
        (re)start of the gateway, so a restarted one (or a resumed run's) admits only the
        look-ahead. Dropped episodes give their slots back; repeating totals changes nothing."""
        received, dropped = self.consumed()
        if self.attached is not None:
            weights = self.weights_path(self.version)
            await self.attached.announce(
                self.version, consumed=received, dropped=dropped, weights=weights
            )
            return
        weights = self.weights_path(self.version)  # an engine attached later loads it first
        await best_effort(
            gateway.set_version(self.version, dropped=dropped, consumed=received, weights=weights)
        )

    def weights_path(self, version: int) -> str | None:
        """Where ``version``'s weights are on disk (a disk weight sync), for an engine that
        attaches later; ``None`` when the sync keeps no such directory."""
        version_dir = getattr(self.sync, "version_dir", None)
        if version == 0 or version_dir is None:
            return None
        path = Path(version_dir(version))
        return str(path) if path.is_dir() else None

    def metrics(self) -> MetricsHub:
        import importlib.util

        names = self.config.logging.metric_sinks
        if names is None:
            names = ["train_log", "jsonl", "events"]
            if importlib.util.find_spec("tensorboard") is not None:
                names.append("tensorboard")
        return MetricsHub({n: make_metric_sink(n, {"log_dir": str(self.log_dir)}) for n in names})

    def observe(self, trajectory: Trajectory) -> None:
        """Every trajectory the trainer takes: data position, and ``[rollout]`` events (one per
        ``trigger_batch_size`` episodes; a discarded episode's tombstone is not one)."""
        if trajectory.is_tombstone:
            return
        index = trajectory.metadata.get("task_index")
        if isinstance(index, int):
            self.seen_tasks.add(index)
        worker = str(trajectory.metadata.get("worker", "?"))
        self.worker_episodes[worker] = self.worker_episodes.get(worker, 0) + 1
        tokens = self._tokens_of[trajectory.session_id] = sum(
            s.generated_tokens for s in trajectory.samples
        )
        self._rollout_window.append(trajectory)
        self._window_samples += len(trajectory.samples)
        self._window_tokens += tokens
        self._arrivals.add(trajectory, self.version)
        samples = self._window_samples
        if len(self._rollout_window) >= self.config.async_.trigger_batch_size:
            self.rollout_step += 1
            window, self._rollout_window = self._rollout_window, []
            tokens, self._window_samples, self._window_tokens = self._window_tokens, 0, 0
            rewards = [t.reward for t in window if t.reward is not None]
            arrivals = self._arrivals.take()
            if self.hub is None:
                return
            self.hub.write(
                "rollout",
                self.rollout_step,
                {
                    "generated": samples,
                    "tokens": tokens,
                    "reward": sum(rewards) / len(rewards) if rewards else 0.0,
                    "episodes": len(window),
                    **arrivals,
                },
            )

    def run_values(self) -> dict[str, MetricValue]:
        """The ``run`` event: the limits the monitor draws its bars and warnings against, and
        the loss being trained (``algorithm.loss``), so runs that compare losses say which."""
        config = self.config
        return {
            "loss": config.algorithm.loss,
            "max_steps": config.train.max_steps,
            "staleness_threshold": config.async_.staleness_threshold,
            "queue_max_size": config.async_.queue_max_size,
            "trigger_batch_size": config.async_.trigger_batch_size,
            "rollout_workers": config.async_.rollout_workers,
            "version": self.version,
        }

    async def account(
        self,
        gateway: GatewayAdmin,
        observed: ObservedSource,
        loop: TrainerLoop,
        metrics: MetricsHub,
    ) -> None:
        """``sent = trained + dropped + discarded + queued + running`` in episodes
        (:mod:`.accounting`), and the samples of both ends of the queue; plus, for the live
        monitor, episodes per rollout worker, the queue's time at ``queue_max_size``, tokens
        trained and process restarts."""
        source = observed.source
        status = await best_effort(gateway.status()) or {}
        budget = status.get("budget") or {}
        counters = loop.counters()
        for session_id, _meta in loop.last_batch:
            self.tokens_trained += self._tokens_of.pop(session_id, 0)
        if len(self._tokens_of) > 100_000:  # dropped episodes are never trained: forget the oldest
            for stale in list(self._tokens_of)[:50_000]:
                del self._tokens_of[stale]
        running: dict[str, Any] = status.get("open_by_worker") or {}
        workers = {str(w) for w in running} | set(self.worker_episodes)
        children = self.supervisor.children if self.supervisor else []
        values = self.ledger.values(loop, source, int(budget.get("running", 0)))
        values.update(
            {
                "trajectories_received": source.received,
                # malformed messages the queue counted and skipped (a producer's bug, or noise)
                "trajectories_rejected": int(getattr(source, "rejected", 0)),
                "trajectories_queued": source.buffered,
                # the queue's memory against queue_max_size (wire bytes; zmq's source counts them)
                "trajectories_queued_peak": int(getattr(source, "peak_buffered", 0)),
                "queue_bytes": int(getattr(source, "buffered_bytes", 0)),
                "queue_peak_bytes": int(getattr(source, "peak_buffered_bytes", 0)),
                "samples_trained": counters["trained"],
                "samples_dropped": counters["dropped"],
                "samples_buffered": counters["buffered"],
                "queue_full_seconds": round(observed.full_seconds(), 3),
                "tokens_trained": self.tokens_trained,
                "sessions_expired": int(status.get("expired", 0)),
                # workers' long polls held for a slot: rollouts the staleness budget holds back
                "sessions_waiting": int(status.get("waiting", 0)),
                "restarts": sum(c.restarts for c in children),
            }
        )
        for worker in sorted(workers, key=lambda w: (len(w), w)):
            values[f"rollout{worker}_running"] = int(running.get(worker, 0))
            values[f"rollout{worker}_episodes"] = self.worker_episodes.get(worker, 0)
        metrics.write("accounting", counters["steps"], values)

    def audit(self, loop: TrainerLoop) -> None:
        """``{output_dir}/run/trained.jsonl``: which episode (task and sample, or online
        conversation) was trained at which step, in which group, so anyone can check that
        nothing is trained twice (across resumes too)."""
        step = loop.state_dict()["steps"]
        with open(self.run_dir / "trained.jsonl", "a", encoding="utf-8") as f:
            for session_id, meta in loop.last_batch:
                record = {"step": step, "session_id": session_id, **_audit_fields(meta)}
                f.write(json.dumps(record) + "\n")

    def save(self, loop: TrainerLoop) -> Path:
        """A checkpoint: the engine's model and optimizer, the loop's counters and buffered
        trajectories, and the data position.

        A save that fails (a full disk) ends the run, in one line: training on without
        checkpoints would spend compute a crash then loses, and the final save would meet the
        same disk. The last good checkpoint stays; ``--resume`` goes on from it."""
        assert self.engine is not None
        engine, step = self.engine, loop.state_dict()["steps"]
        try:
            path = save_checkpoint(
                self.out,
                step=step,
                write_engine=lambda tmp: engine.save(tmp, step),
                state={
                    "loop": loop.state_dict(),
                    "data": {"seen": set_to_ranges(self.seen_tasks)},
                },
                pending=loop.pending(),
                keep=self.config.logging.keep_checkpoints,
            )
        except CheckpointError as err:
            hint = "; free space, then `areal train --resume`" if err.no_space else ""
            raise RunError(f"{err}{hint}") from err
        log.info("checkpoint %s", path)
        return path

    def install_signal_handlers(self) -> None:
        """First Ctrl-C / SIGTERM: finish the step, checkpoint, stop. Second: stop now."""
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            if self.stop.is_set():
                raise KeyboardInterrupt
            self.stopped_by = "signal"
            log.warning("stopping after the current step (again to stop at once)")
            self.stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, on_signal)


def checkpoint_start(checkpoint: Any) -> tuple[int, list[list[int]]]:
    """Where rollout workers start: after a resume, the first task the trainer never saw."""
    if checkpoint is None:
        return 0, []
    seen = checkpoint.state["data"]["seen"]
    start = 0
    if seen and seen[0][0] == 0:
        start = seen[0][1]
    return start, seen


def _threads(config: RunConfig) -> int:
    """Torch threads per process: the cores shared by the trainer and the engines (tiny models
    run fastest with one thread each; oversubscribing cores slows every process down)."""
    if config.train.cpu_affinity:
        return len(config.train.cpu_affinity)
    cores = os.cpu_count() or 1
    return max(1, cores // (1 + config.inference.engines))


def _sync_values(
    published: Published, phases: dict[str, float], overlapped: bool
) -> dict[str, MetricValue]:
    """The ``sync`` event: the weight sync that made a version, with its phases' seconds
    (``overlapped`` 1: all but the save ran beside the next train step)."""
    values: dict[str, MetricValue] = {
        "version": published.version,
        "seconds": published.seconds,
        "overlapped": int(overlapped),
    }
    values.update((f"{phase}_seconds", seconds) for phase, seconds in phases.items())
    return values


def _policy_model_id(config: RunConfig) -> str:
    if config.agent.gateway_config:
        return RouterConfig.load(config.agent.gateway_config).policy.model_id
    return RouterConfig().policy.model_id


def _audit_fields(meta: dict[str, Any]) -> dict[str, Any]:
    """What names a trained episode: its task and sample (a rollout worker's), or its online
    conversation; and its group."""
    keys = ("task_index", "sample", "worker", "conversation", "group")
    return {k: meta[k] for k in keys if k in meta}


def _write_summary(path: Path, summary: RunSummary) -> None:
    import dataclasses

    path.write_text(json.dumps(dataclasses.asdict(summary), indent=2, default=str) + "\n")


def success_reward(config: RunConfig) -> float | None:
    """The reward at which an episode solved its task: ``dataset.success_reward``, else the
    task set's own rule (a tasks file has none unless the config gives one)."""
    if config.dataset.success_reward is not None or config.dataset.name is None:
        return config.dataset.success_reward
    from areal.core.tasks import task_set

    return task_set(config.dataset.name).success_reward
