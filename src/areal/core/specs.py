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
    """An inference server the run can start, and the client that talks to it.

    ``launcher`` is a ``"module:attr"`` path to a callable that turns the run's backend-neutral
    engine options (:data:`ENGINE_OPTIONS`) into the server's command line; ``client`` one to the
    :class:`~areal.core.engine_client.EngineClient` class speaking its HTTP API; ``env`` what the
    server process needs in its environment; ``collective`` the ``torch.distributed`` backend
    its weight-update group uses; ``check`` one to ``why_not_runnable(python) -> str | None``,
    which says why this machine cannot run the server (``None``: it can; empty: no check).
    """

    name: str
    launcher: str
    description: str = ""
    needs_gpu: bool = False
    gpu_if_present: bool = False  # runs on a CPU, but on the GPUs of a machine that has them
    client: str = "areal.plugins.inference.sglang_client:InferenceClient"
    env: dict[str, str] = field(default_factory=dict)
    collective: str = "gloo"
    check: str = ""
    extras: dict[str, Any] = field(default_factory=dict)

    def load_launcher(self) -> Any:
        return load_object(self.launcher)

    def load_client(self) -> Any:
        return load_object(self.client)

    def why_not_runnable(self, python: str | None = None) -> str | None:
        return load_object(self.check)(python) if self.check else None


# What the run hands every backend's launcher (``InferenceBackend.launcher``): a launcher maps
# these onto its server's own flags and may ignore what its server has no use for.
ENGINE_OPTIONS = (
    "model_path",  # a local checkpoint directory
    "host",  # optional: the address to listen on (default loopback; another: reachable remotely)
    "port",
    "max_running_requests",
    "weight_version",  # the version the weights in model_path are
    "seed",
    "log_level",
    "tp_size",
    "max_total_tokens",  # optional: KV-cache tokens
    "mem_fraction_static",  # optional: GPU memory share
    "python_executable",  # optional: the interpreter that has the engine installed
    "extra_args",  # optional: flags of the server's own, appended to its command line as given
)


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
