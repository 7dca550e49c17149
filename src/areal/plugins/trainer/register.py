"""The built-in training engine, registered through ``areal_register_engines`` like any other.

``fsdp``: the PyTorch-native 5D engine (FSDP2/HSDP, TP+SP, PP, Ulysses CP, EP on one named
DeviceMesh) for the decoder families of :mod:`areal.plugins.models`; one process on CPU or GPU,
or ``async.train_workers`` ranks under torchrun. ``archon`` (the seed article's name for it) is an
alias: the same spec, so ``train.engine: archon`` runs exactly this engine.
"""

from __future__ import annotations

from areal.core.hookspecs import Register, hookimpl
from areal.core.specs import TrainEngineSpec

_PKG = "areal.plugins.trainer"

FSDP_ENGINE = TrainEngineSpec(
    name="fsdp",
    build=f"{_PKG}.engine:build",
    follow=f"{_PKG}.engine:follow",
    parallelize=f"{_PKG}.parallel.parallelize:parallelize_decoder",
    train_step=f"{_PKG}.step:train_step",
    model_families=("llama", "qwen2", "qwen3", "qwen3_moe"),
    description="PyTorch-native FSDP2 + TP/PP/CP/EP on one DeviceMesh (gloo on CPU, NCCL on GPUs)",
)


ENGINE_ALIASES = ("archon",)


@hookimpl
def areal_register_engines(register: Register) -> None:
    register(FSDP_ENGINE.name, FSDP_ENGINE)
    for alias in ENGINE_ALIASES:
        register(alias, FSDP_ENGINE)  # Registry.aliases() knows it by the spec's own name
