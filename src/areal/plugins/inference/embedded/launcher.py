"""The command line that starts an embedded engine as its own process (used by the run supervisor)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from areal.host.bind import is_loopback


@dataclass
class EmbeddedServerConfig:
    model_path: str
    host: str = "127.0.0.1"
    port: int = 30000
    max_total_tokens: int | None = None
    mem_fraction_static: float | None = None
    max_running_requests: int = 64
    weight_version: str | None = None
    seed: int = 0
    log_level: str = "info"
    compile_decode: bool = False  # --compile-decode: a compiled decode step (slower start)
    # True: --pack-weights, False: --no-pack-weights; None: the engine measures which is faster
    pack_weights: bool | None = None
    # True: --decode-kernel, False: --no-decode-kernel; None: the kernel when it builds
    decode_kernel: bool | None = None
    extra_args: list[str] = field(default_factory=list)


def build_command(config: EmbeddedServerConfig | Mapping[str, Any]) -> list[str]:
    """``areal serve inference ...`` for ``config`` (a mapping of its fields is accepted, so code
    that must not import this module can launch one through the backend registry)."""
    if not isinstance(config, EmbeddedServerConfig):
        config = EmbeddedServerConfig(**config)
    cmd = [
        sys.executable, "-m", "areal", "serve", "inference",
        "--model", config.model_path,
        "--host", config.host,
        "--port", str(config.port),
        "--max-running-requests", str(config.max_running_requests),
        "--seed", str(config.seed),
        "--log-level", config.log_level,
    ]  # fmt: skip
    if config.max_total_tokens is not None:
        cmd += ["--max-total-tokens", str(config.max_total_tokens)]
    if config.mem_fraction_static is not None:
        cmd += ["--mem-fraction-static", str(config.mem_fraction_static)]
    if config.weight_version is not None:
        cmd += ["--weight-version", config.weight_version]
    if config.compile_decode:
        cmd.append("--compile-decode")
    if config.pack_weights is not None:
        cmd.append("--pack-weights" if config.pack_weights else "--no-pack-weights")
    if config.decode_kernel is not None:
        cmd.append("--decode-kernel" if config.decode_kernel else "--no-decode-kernel")
    if not is_loopback(config.host):  # the run asked for it (launcher.listen: node)
        cmd.append("--allow-remote")
    return cmd + list(config.extra_args)


def engine_command(options: Mapping[str, Any]) -> list[str]:
    """The run's backend-neutral engine options (``areal.core.specs.ENGINE_OPTIONS``) as a
    command line: this engine is one process on one device, so it serves ``tp_size`` 1 only."""
    fields = dict(options)
    fields.pop("python_executable", None)  # the engine runs in areal's own interpreter
    tp_size = int(fields.pop("tp_size", 1))
    if tp_size != 1:
        raise ValueError(
            f"inference.tp_size: the embedded engine runs on one device (got {tp_size}); "
            "set it to 1, or use inference.backend: vllm or sglang to shard a model"
        )
    return build_command(fields)
