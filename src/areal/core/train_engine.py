"""The contract between a run and its training engine (``train.engine``), torch-free.

A training engine is registered through ``areal_register_engines`` as one
:class:`~areal.core.specs.TrainEngineSpec` bundle: the model families it trains, its
``parallelize_*`` function and its train step, plus the two entry points a run calls (``build``
on the driving process, ``follow`` on every other rank). The run (:mod:`areal.run`) hands it
whole config sections (:class:`EngineSetup`) and then only talks to the :class:`TrainEngine` it
gets back, so a third-party trainer replaces the built-in one through the same hook, and the run
itself never imports torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from areal.core.run_config import (
        AlgorithmConfig,
        DatasetConfig,
        InferenceConfig,
        ModelConfig,
        RunConfig,
        TrainConfig,
        WarmStartConfig,
    )
    from areal.core.types import Sample

__all__ = [
    "DIST_TIMEOUT_ENV",
    "EngineError",
    "EngineSetup",
    "StagedWeightSync",
    "TrainEngine",
    "WeightSync",
    "WeightSyncError",
    "dist_timeout",
    "is_staged",
    "launched",
    "rank",
]

DIST_TIMEOUT_ENV = "AREAL_DIST_TIMEOUT_S"  # collectives and torchrun's grace period, seconds
DEFAULT_DIST_TIMEOUT_S = 300.0


class EngineError(RuntimeError):
    """The engine cannot start or go on (a bad layout, a checkpoint it cannot resume, a rank
    that died); the message says why in one line."""


class WeightSyncError(RuntimeError):
    """A weight sync failed: ``phase`` is save, pause, update or continue; ``url`` the engine;
    ``stalled``: the engine did not answer within the phase's timeout (the watchdog fired)."""

    def __init__(self, phase: str, url: str | None, message: str, *, stalled: bool = False) -> None:
        self.phase = phase
        self.url = url
        self.stalled = stalled
        where = f" on {url}" if url else ""
        super().__init__(f"weight sync {phase} failed{where}: {message}")


SECTIONS = ("model", "train", "algorithm", "warm_start", "dataset", "inference")


@dataclass(frozen=True)
class EngineSetup:
    """What a run hands its training engine: the config sections it owns, never re-spelled
    fields. ``inference`` says how new weights reach the inference engines."""

    model: ModelConfig
    train: TrainConfig
    algorithm: AlgorithmConfig
    warm_start: WarmStartConfig
    dataset: DatasetConfig
    inference: InferenceConfig
    output_dir: Path
    threads: int = 1  # torch threads of this process
    resume_from: Path | None = None  # the checkpoint directory a ``--resume`` continues from
    # Where the trainer's own servers listen (the weight group's store): its node's address on
    # a run across machines (``launcher.listen: node``).
    listen_address: str = "127.0.0.1"

    @classmethod
    def from_config(
        cls,
        config: RunConfig,
        output_dir: Path,
        *,
        threads: int = 1,
        resume_from: Path | None = None,
    ) -> EngineSetup:
        from areal.host.on_node import node_address

        sections = {name: getattr(config, name) for name in SECTIONS}
        listen = node_address() if config.launcher.listen == "node" else "127.0.0.1"
        return cls(
            **sections,
            output_dir=output_dir,
            threads=threads,
            resume_from=resume_from,
            listen_address=listen,
        )


class WeightSync(Protocol):
    """Makes the inference engines serve the trainer's newest weights (disk or a collective)."""

    engine_urls: list[str]
    last_phases: dict[str, float]  # seconds of each phase of the last publish

    async def publish(self, model: Any, version: int) -> float:
        """Serve ``model``'s weights as ``version``; the seconds it took."""
        ...

    async def catch_up(self, url: str, version: int) -> None:
        """Bring a (re)started engine at ``url`` to ``version`` if it is behind."""
        ...

    async def close(self) -> None: ...


class StagedWeightSync(WeightSync, Protocol):
    """A weight sync in two halves, so that the engines can load a version while the trainer's
    next step runs (async mode): only :meth:`save` reads the weights. ``publish`` is the two in
    a row."""

    async def save(self, model: Any, version: int) -> float:
        """Take what the engines will load from ``model`` (a checkpoint on disk); the seconds."""
        ...

    async def deliver(self, version: int) -> float:
        """Make the engines serve the saved ``version``; the seconds it took."""
        ...


def is_staged(sync: object) -> bool:
    """Can ``sync`` save and deliver separately (:class:`StagedWeightSync`)?"""
    return callable(getattr(sync, "save", None)) and callable(getattr(sync, "deliver", None))


class TrainEngine(Protocol):
    """What the run needs of a training engine, once ``build`` returned it."""

    policy_dir: Path  # the weights the run started from: the tokenizer's home and the KL anchor
    weights_dir: Path  # what the inference engines start from (a resumed checkpoint's model)

    def step(
        self, samples: list[Sample], *, group_ids: list[int], current_version: int
    ) -> dict[str, float]:
        """One RL step on ``samples`` (blocking; the run calls it in a worker thread). The stats
        hold at least ``loss``, ``grad_norm`` and ``clip_fraction``."""
        ...

    def weights(self) -> Any:
        """The newest weights, as the engine's :meth:`weight_sync` publishes them (several
        ranks: gathered to this process, a collective)."""
        ...

    def weight_sync(self, weights_dir: Path) -> WeightSync:
        """The weight sync ``inference.weight_sync`` names (``weights_dir``: where disk syncs
        write)."""
        ...

    def save(self, directory: Path, step: int) -> None:
        """Write the model (Hugging Face layout, under ``directory/model``) and the optimizer
        into a checkpoint being written; the run adds its own state beside them."""
        ...

    def stop(self) -> None:
        """Release the ranks (never blocks)."""
        ...


def dist_timeout() -> float:
    """How long a collective may wait for a rank before the run fails (``AREAL_DIST_TIMEOUT_S``)."""
    raw = os.environ.get(DIST_TIMEOUT_ENV, "")
    try:
        return float(raw) if raw else DEFAULT_DIST_TIMEOUT_S
    except ValueError:
        raise ValueError(f"{DIST_TIMEOUT_ENV}: {raw!r} is not a number of seconds") from None


def launched() -> bool:
    """Whether this process is one rank of several (torchrun's environment is set)."""
    return "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


def rank() -> int:
    return int(os.environ.get("RANK", "0"))
