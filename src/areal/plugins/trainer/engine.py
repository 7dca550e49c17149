"""The ``fsdp`` training engine: what a run gets when ``train.engine: fsdp`` (the default).

:func:`build` turns the run's config sections (:class:`~areal.core.train_engine.EngineSetup`)
into a :class:`FSDPEngine`, in this order:

1. **ranks**: under torchrun (``async.train_workers > 1``) join the process group first, since
   the other ranks wait in the same rendezvous (:func:`~.ranks.init_ranks`);
2. **the policy it starts from**: areal's tiny model when ``model.init_tiny`` asks and none is
   there, then the cached format warm start (``warm_start.steps``);
3. **the trainable policy**: on one process the model, AdamW and (with ``algorithm.kl_coef``)
   the frozen KL reference; on several ranks every rank builds its shards on the meta device
   (:class:`~.ranks.RankGroup`); a ``--resume`` loads the checkpoint's weights and optimizer.

Each :meth:`FSDPEngine.step` is one :func:`~.step.train_step` (the ``algorithm.loss`` on packed
samples, checked by :func:`check_loss` before step 1) with the step options of the ``algorithm``
and ``train`` sections; :meth:`FSDPEngine.weights`
is what the weight sync publishes; :meth:`FSDPEngine.save` writes the model and the optimizer
into a checkpoint the run is writing. :func:`follow` is every other rank's whole life.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from areal.core.engine_client import collective_backend
from areal.core.train_engine import EngineError, EngineSetup, WeightSync, launched
from areal.core.types import Sample
from areal.host.faults import crash_point
from areal.host.heap import keep_freed_memory
from areal.plugins.models.decoder import DecoderForCausalLM
from areal.plugins.models.hf_io import load_model, save_model
from areal.plugins.trainer.step import SEQUENCE_AGG_MODES, loss_agg_mode, train_step

log = logging.getLogger("areal.train")

__all__ = [
    "FSDPEngine",
    "Policy",
    "build",
    "check_loss",
    "follow",
    "make_weight_sync",
    "step_options",
]

DCP_DIR = "dcp"  # the sharded model + optimizer inside a checkpoint directory (several ranks)
OPTIMIZER_FILE = "optimizer.pt"  # the optimizer's state_dict (one process)
# The crash points (areal.host.faults) of FSDPEngine.save, in order; the run's follow them
# (areal.run.checkpoint.SAVE_PHASES).
SAVE_PHASES: tuple[str, ...] = ("engine.model_written",)


def step_options(setup: EngineSetup) -> dict[str, Any]:
    """:func:`train_step`'s options, read from the sections that own them."""
    algo, train = setup.algorithm, setup.train
    return {
        "mini_batch_size": train.mini_batch_size,
        "max_grad_norm": train.max_grad_norm,
        "advantage": algo.advantage,
        "advantage_options": {
            **algo.advantage_options,
        },
        "advantage_norm": algo.advantage_norm,
        "loss": algo.loss,
        "loss_options": dict(algo.loss_options),
        "eps_clip": algo.eps_clip,
        "eps_clip_high": algo.eps_clip_high,
        "behavior_weight_cap": algo.behavior_weight_cap,
        "prox_logp": algo.prox_logp,
        "kl_coef": algo.kl_coef,
    }


def check_loss(setup: EngineSetup) -> None:
    """``algorithm.loss`` with its options, and the estimator's ``algorithm.advantage_options``,
    checked before anything slow: names against the signatures (a typed ``algorithm`` field the
    loss does not take is logged as ignored), values by one call on four tokens; sequence-level
    options and the per-sequence ``loss_agg_mode`` values need whole sequences on a rank (no
    context parallelism). Raises :class:`EngineError` with one ``key: why; fix`` per problem."""
    from areal.core.loss_options import (
        OPTIONS_KEY,
        TYPED_OPTIONS,
        call_options,
        check_advantage_options,
        ignored_typed,
    )
    from areal.core.plugins import registry
    from areal.plugins.trainer.loss_probe import probe_loss

    algo = setup.algorithm
    try:
        losses = registry("losses")
        fn = _loaded(losses.get(algo.loss, key="algorithm.loss"))
        typed = {name: getattr(algo, name) for name in TYPED_OPTIONS}
        explicit = set(TYPED_OPTIONS) & algo.model_fields_set
        options = call_options(
            fn, loss=algo.loss, options=algo.loss_options, typed=typed, explicit=explicit
        )
        probe_loss(fn, options, loss=algo.loss)
        estimator = _loaded(losses.get(f"advantage/{algo.advantage}", key="algorithm.advantage"))
        check_advantage_options(estimator, algo.advantage_options, advantage=algo.advantage)
        for line in ignored_typed(fn, loss=algo.loss, explicit=explicit):
            log.warning("%s", line)
    except ValueError as err:
        raise EngineError(str(err).replace("\n", "; ")) from err
    cp = setup.train.parallelism.cp
    levels = ("sequence", "sequence_mean_adv")
    sequence = sorted(k for k, v in options.items() if k.endswith("_level") and v in levels)
    if sequence and cp > 1:
        raise EngineError(
            f"{OPTIONS_KEY}.{sequence[0]}: sequence level needs whole sequences on each rank, but "
            f"train.parallelism.cp {cp} splits them; use token level or cp: 1"
        )
    mode = loss_agg_mode(fn, options)
    if mode in SEQUENCE_AGG_MODES and cp > 1:
        raise EngineError(
            f"{OPTIONS_KEY}.loss_agg_mode: {mode} averages each sequence, but "
            f"train.parallelism.cp {cp} splits sequences over ranks; use loss_agg_mode "
            "token-mean or cp: 1"
        )


def _loaded(entry: Any) -> Any:
    """A registry entry's function (the built-ins register lazy stand-ins with ``load``)."""
    load = getattr(entry, "load", None)
    return load() if callable(load) else entry


@dataclass
class Policy:
    """One process's trainable policy: the model, its optimizer, the frozen KL reference (or
    ``None``) and :func:`train_step`'s options."""

    model: DecoderForCausalLM
    optimizer: torch.optim.Optimizer
    options: dict[str, Any]
    reference: DecoderForCausalLM | None = None

    @classmethod
    def of(
        cls,
        model: DecoderForCausalLM,
        optimizer: torch.optim.Optimizer,
        *,
        reference: DecoderForCausalLM | None = None,
        **options: Any,
    ) -> Policy:
        """A policy with :func:`train_step`'s keyword options given directly (tests, benches)."""
        return cls(model, optimizer, options, reference)

    def step(
        self, samples: list[Sample], *, group_ids: list[int], current_version: int
    ) -> dict[str, float]:
        return train_step(
            self.model,
            self.optimizer,
            samples,
            group_ids=group_ids,
            current_version=current_version,
            reference=self.reference,
            **self.options,
        )

    def weights(self) -> DecoderForCausalLM:
        return self.model


class FSDPEngine:
    """The run's handle on the trainer (see the module docstring); one process or rank 0."""

    def __init__(
        self,
        setup: EngineSetup,
        policy_dir: Path,
        weights_dir: Path,
        policy: Policy | None = None,
        group: Any = None,
    ) -> None:
        self.setup = setup
        self.policy_dir = policy_dir
        self.weights_dir = weights_dir
        self.policy = policy
        self.group = group  # a RankGroup under torchrun
        self.options = step_options(setup)

    def step(
        self, samples: list[Sample], *, group_ids: list[int], current_version: int
    ) -> dict[str, float]:
        if self.policy is not None:
            return self.policy.step(samples, group_ids=group_ids, current_version=current_version)
        options = {**self.options, "group_ids": group_ids, "current_version": current_version}
        stats: dict[str, float] = self.group.step(samples, options)
        return stats

    def weights(self) -> DecoderForCausalLM:
        """One process: the model itself. Several ranks: they gather the full weights into rank
        0's unsharded shadow copy (a collective), which the weight sync then sends as is."""
        if self.policy is not None:
            return self.policy.model
        shadow: DecoderForCausalLM = self.group.gather()
        return shadow

    def weight_sync(self, weights_dir: Path) -> WeightSync:
        return make_weight_sync(self.setup, weights_dir)

    def save(self, directory: Path, step: int) -> None:
        """``model/`` (Hugging Face layout with the tokenizer of the starting model) and the
        optimizer: ``optimizer.pt`` on one process, the sharded ``dcp/`` on several ranks (the
        shadow holds the newest published weights: each step publishes before it checkpoints)."""
        model = self.policy.model if self.policy is not None else self.group.shadow
        save_model(model, directory / "model")
        _copy_tokenizer(self.policy_dir, directory / "model")
        crash_point("engine.model_written")
        if self.policy is not None:
            # Through a Python file, so a full disk raises OSError(ENOSPC), not torch's bare
            # RuntimeError.
            with open(directory / OPTIMIZER_FILE, "wb") as f:
                torch.save(self.policy.optimizer.state_dict(), f)
        else:
            self.group.save(directory / DCP_DIR, step)

    def stop(self) -> None:
        if self.group is not None:
            self.group.stop()  # the followers return (or, after a failure, are stopped)


def build(setup: EngineSetup) -> FSDPEngine:
    """The engine of a run (module docstring); ``EngineError`` says in one line why not."""
    check_loss(setup)
    ranks = None
    if launched():  # before anything slow: the other ranks wait in the same rendezvous
        from areal.plugins.trainer.ranks import init_ranks

        try:
            ranks = init_ranks(setup)
        except ValueError as err:
            raise EngineError(str(err)) from err
    resume = setup.resume_from
    if resume is not None:
        _check_resumable(resume, several=ranks is not None)
    policy_dir = prepare_policy(setup)
    weights_dir = resume / "model" if resume is not None else policy_dir
    torch.manual_seed(setup.train.seed)
    torch.set_num_threads(setup.threads)
    # A train step allocates and frees its activations and gradients every step; with glibc's
    # default thresholds they come back as fresh pages, each faulted in and zeroed (measured in
    # an async run: 19 % of the trainer's core in the kernel's clear_page).
    keep_freed_memory()
    if ranks is not None:
        from areal.plugins.trainer.ranks import RankGroup, Start

        start = Start(
            weights_dir=str(weights_dir),
            reference_dir=str(policy_dir) if setup.algorithm.kl_coef else None,
            resume_dir=str(resume / DCP_DIR) if resume is not None else None,
        )
        try:
            group = RankGroup(ranks, setup, start)
        except ValueError as err:
            raise EngineError(str(err)) from err
        return FSDPEngine(setup, policy_dir, weights_dir, group=group)
    dtype = getattr(torch, setup.model.dtype)
    model = load_model(weights_dir, dtype=dtype).train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=setup.train.learning_rate, weight_decay=0.0
    )
    if resume is not None:
        optimizer.load_state_dict(torch.load(resume / OPTIMIZER_FILE, weights_only=True))
    reference = None
    if setup.algorithm.kl_coef:
        # The KL anchor is the policy the run started from (after the warm start), also after a
        # resume.
        reference = load_model(policy_dir, dtype=dtype).eval().requires_grad_(False)
    policy = Policy(model, optimizer, step_options(setup), reference)
    return FSDPEngine(setup, policy_dir, weights_dir, policy=policy)


def follow(setup: EngineSetup) -> None:
    """A follower rank's whole life: hold its shards and do what rank 0 says until ``stop``."""
    from areal.plugins.trainer.ranks import follow as follow_rank_zero

    keep_freed_memory()  # as rank 0 (build)
    follow_rank_zero(setup)


def prepare_policy(setup: EngineSetup) -> Path:
    """The weights the run starts from (before any checkpoint): ``model.path``, created as areal's
    tiny model if asked, then warm-started on the task set's format demonstrations (cached)."""
    model = setup.model
    path = Path(model.path)
    if model.init_tiny and not (path / "config.json").is_file():
        from areal.plugins.models.tiny import init_tiny

        init_tiny(path, size=model.init_tiny, seed=setup.train.seed)
        log.info("created the %s tiny model at %s", model.init_tiny, path)
    warm = setup.warm_start
    if warm.steps and setup.dataset.name:
        from areal.plugins.trainer.warm_start import warm_start

        started = time.perf_counter()
        path = warm_start(
            path,
            setup.output_dir / "warm_start",
            task_set=setup.dataset.name,
            steps=warm.steps,
            batch_size=warm.batch_size,
            learning_rate=warm.learning_rate,
            seed=setup.train.seed,
        )
        log.info("warm start ready at %s (%.1fs)", path, time.perf_counter() - started)
    return path


def make_weight_sync(setup: EngineSetup, weights_dir: Path) -> WeightSync:
    """``inference.weight_sync``: safetensors on disk, or a collective broadcast (gloo to the
    embedded engine on CPU, NCCL to SGLang and vLLM on GPUs)."""
    inference = setup.inference
    # The watchdog: one timeout for every engine call of a sync, or each phase's own default.
    timeout = inference.weight_sync_timeout_s
    pause, update = (timeout, timeout) if timeout is not None else (60.0, 300.0)
    if inference.weight_sync == "collective":
        from areal.plugins.trainer.collective_sync import CollectiveWeightSync

        backend = collective_backend(inference.backend, gpus=torch.cuda.is_available())
        return CollectiveWeightSync(
            [],
            backend=backend,
            master_address=setup.listen_address,
            bucket_bytes=inference.weight_sync_bucket_mb * 1024**2,
            pause_mode=inference.pause_mode,
            engine_backend=inference.backend,
            # SGLang joins every tensor-parallel rank of an engine; the embedded engine is one.
            tp_size=1 if inference.backend == "embedded" else inference.tp_size,
            join_timeout=timeout if timeout is not None else 120.0,
            pause_timeout=pause,
            update_timeout=update,
            continue_timeout=pause,
        )
    from areal.plugins.trainer.weight_sync import DiskWeightSync

    return DiskWeightSync(
        [],
        weights_dir,
        pause_mode=inference.pause_mode,
        engine_backend=inference.backend,
        pause_timeout=pause,
        update_timeout=update,
        continue_timeout=pause,
    )


def _check_resumable(found: Path, *, several: bool) -> None:
    """One rank saves ``optimizer.pt``, several a sharded ``dcp/``: each resumes only its own."""
    if several and not (found / DCP_DIR).is_dir():
        raise EngineError(
            f"--resume: {found} was saved by one trainer rank ({OPTIMIZER_FILE}, no {DCP_DIR}/); "
            "resume it with async.train_workers: 1"
        )
    if not several and not (found / OPTIMIZER_FILE).is_file():
        raise EngineError(
            f"--resume: {found} was saved by several trainer ranks (a sharded {DCP_DIR}/); "
            "resume it with async.train_workers > 1"
        )


_WEIGHT_FILES = (".safetensors", ".safetensors.index.json")


def _copy_tokenizer(source: Path, dest: Path) -> None:
    """Everything of the source model dir but its weights and config (tokenizer, template...)."""
    for item in source.iterdir():
        if item.is_file() and not item.name.endswith(_WEIGHT_FILES) and item.name != "config.json":
            shutil.copy2(item, dest / item.name)
