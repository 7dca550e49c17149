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
