"""Torch-free descriptions of the things plugins register; the heavy object loads on demand."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from areal.core.tasks import load_object  # one importer of "module:attr" names


@dataclass(frozen=True)
class ModelFamily:
    """A decoder family: which Hugging Face ``model_type`` values it reads, and where its code is.

    ``model_class`` and ``config_class`` are ``"module:attr"`` paths, imported only when a model is
    built, so ``areal plug list`` and config validation never import torch.
    """

    name: str
    hf_model_types: tuple[str, ...]
    model_class: str
    config_class: str
    description: str = ""

    def load_model_class(self) -> Any:
        return load_object(self.model_class)

    def load_config_class(self) -> Any:
        return load_object(self.config_class)


@dataclass(frozen=True)
class InferenceBackend:
    """An inference server the run can start and talk to over the SGLang native HTTP API.

    ``launcher`` is a ``"module:attr"`` path to a callable building the server's command line.
    """

    name: str
    launcher: str
    description: str = ""
    needs_gpu: bool = False
    extras: dict[str, Any] = field(default_factory=dict)

    def load_launcher(self) -> Any:
        return load_object(self.launcher)


@dataclass(frozen=True)
class TrainEngineSpec:
    """A training engine as one bundle, torchtitan's ``TrainSpec`` idea: choosing it by name
    (``train.engine``) brings the model families it trains, its ``parallelize_*`` function, its
    train step, and the entry points a run calls (:mod:`areal.core.train_engine`).

    Every function is a ``"module:attr"`` path imported when a run starts, so listing engines or
    validating a config never imports torch. ``build(setup) -> TrainEngine`` runs on the driving
    process; ``follow(setup)`` is the whole life of every other rank under torchrun.
    ``model_families`` empty means every registered family.
    """

    name: str
    build: str
    follow: str
    parallelize: str
    train_step: str
    model_families: tuple[str, ...] = ()
    description: str = ""

    def load_build(self) -> Any:
        return load_object(self.build)

    def load_follow(self) -> Any:
        return load_object(self.follow)
