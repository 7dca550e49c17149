"""The SGLang backend: a validated server config, its ``sglang.launch_server`` command, a launcher.

The flag names are SGLang's own (``ServerArgs`` field names with dashes). areal talks to the
running server through :class:`~areal.plugins.inference.sglang_client.InferenceClient`, the same client
it uses for the embedded engine. SGLang needs a CUDA GPU; nothing here imports it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.parse
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from areal.host.process import ServerProcess, start_on_free_port

DType = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]

INSTALL_HINT = "pip install 'areal[sglang]' on a GPU machine"

# What SGLang's sampler reports as a token's log-prob. Unset (SGLang's default), it is
# log softmax(z' / T) over the whole vocabulary, z' the logits after SGLang's penalties, grammar
# mask and logit_bias: with no penalty or bias (a recorded call cannot send one,
# areal.gateway.replayable) that is the trainer's log softmax(z / T), except on grammar-forced
# tokens. Set, it reports log softmax(z') at T = 1, which no trainer recomputes at T != 1 and is
# as masked; so areal pins it off in every SGLang it starts, whatever the caller's environment.
LOGPROB_ENV = {"SGLANG_RETURN_ORIGINAL_LOGPROB": "false"}


class SGLangNotInstalledError(RuntimeError):
    """The interpreter meant to run SGLang cannot import it."""


class SGLangServerConfig(BaseModel):
    """What areal sets on ``sglang.launch_server``; anything else goes in ``extra_args``.

    ``port: 0`` lets :func:`launch` pick a free port. ``python_executable`` runs SGLang from
    another environment (default: this interpreter).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_path: str = Field(min_length=1)
    host: str = Field(default="127.0.0.1", min_length=1)
    port: int = Field(default=30000, ge=0, le=65535)
    tp_size: int = Field(default=1, ge=1)
    dp_size: int = Field(default=1, ge=1)
    mem_fraction_static: float | None = Field(default=None, gt=0.0, lt=1.0)
    max_running_requests: int | None = Field(default=None, ge=1)
    max_total_tokens: int | None = Field(default=None, ge=1)
    random_seed: int | None = None
    dtype: DType = "bfloat16"
    context_length: int | None = Field(default=None, ge=1)
    served_model_name: str | None = None
    weight_version: str | None = None
    skip_tokenizer_init: bool = False
    enable_metrics: bool = False
    api_key: str | None = None
    log_level: str | None = None
    python_executable: str | None = None
    extra_args: list[str] = Field(default_factory=list)

    @field_validator("served_model_name")
    @classmethod
    def _no_colon(cls, value: str | None) -> str | None:
        if value is not None and ":" in value:
            # SGLang reserves "name:adapter" for LoRA and rejects the name at start-up.
            raise ValueError(f"served_model_name may not contain ':' (got {value!r})")
        return value

    @model_validator(mode="after")
    def _extra_args_do_not_repeat(self) -> SGLangServerConfig:
        for arg in self.extra_args:
            flag = arg.split("=", 1)[0]
            if flag in _OWNED_FLAGS:
                raise ValueError(
                    f"extra_args sets {flag}, which is a config key of its own "
                    f"({_key_for(flag)}); set that key instead"
                )
        return self

    @property
    def url(self) -> str:
        """Where a client on this machine reaches the server."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"


_FLAG_KEYS = (
    "model_path",
    "host",
    "port",
    "tp_size",
    "dp_size",
    "dtype",
    "mem_fraction_static",
    "max_running_requests",
    "max_total_tokens",
    "random_seed",
    "context_length",
    "served_model_name",
    "weight_version",
    "api_key",
    "log_level",
    "skip_tokenizer_init",
    "enable_metrics",
)
_ALIASES = {
    "--model": "model_path",
    "--tp": "tp_size",
    "--tensor-parallel-size": "tp_size",
    "--dp": "dp_size",
    "--data-parallel-size": "dp_size",
}
_OWNED_FLAGS = {"--" + key.replace("_", "-") for key in _FLAG_KEYS} | set(_ALIASES)


def _key_for(flag: str) -> str:
    return _ALIASES.get(flag, flag.removeprefix("--").replace("-", "_"))


def _flag_values(config: SGLangServerConfig) -> dict[str, str | None]:
    """Every flag areal owns → its value (``None`` for a bare switch), in command-line order."""
    flags: dict[str, str | None] = {
        "--model-path": config.model_path,
        "--host": config.host,
        "--port": str(config.port),
        "--tp-size": str(config.tp_size),
        "--dp-size": str(config.dp_size),
        "--dtype": config.dtype,
    }
    optional = {
        "--mem-fraction-static": config.mem_fraction_static,
        "--max-running-requests": config.max_running_requests,
        "--max-total-tokens": config.max_total_tokens,
        "--random-seed": config.random_seed,
        "--context-length": config.context_length,
        "--served-model-name": config.served_model_name,
        "--weight-version": config.weight_version,
        "--api-key": config.api_key,
        "--log-level": config.log_level,
    }
    flags.update({flag: str(value) for flag, value in optional.items() if value is not None})
    switches = {
        "--skip-tokenizer-init": config.skip_tokenizer_init,
        "--enable-metrics": config.enable_metrics,
    }
    flags.update({flag: None for flag, on in switches.items() if on})
    return flags


def _as_config(config: SGLangServerConfig | Mapping[str, Any]) -> SGLangServerConfig:
    if isinstance(config, SGLangServerConfig):
        return config
    return SGLangServerConfig.model_validate(dict(config))


def build_command(config: SGLangServerConfig | Mapping[str, Any]) -> list[str]:
    """The ``python -m sglang.launch_server ...`` command line for ``config``."""
    cfg = _as_config(config)
    command = [cfg.python_executable or sys.executable, "-m", "sglang.launch_server"]
    for flag, value in _flag_values(cfg).items():
        command.append(flag)
        if value is not None:
            command.append(value)
    command.extend(cfg.extra_args)
    return command


def engine_command(options: Mapping[str, Any]) -> list[str]:
    """The run's backend-neutral engine options (``areal.core.specs.ENGINE_OPTIONS``) as an
    SGLang command line: the run's ``seed`` is SGLang's ``random_seed``."""
    fields = dict(options)
    if "seed" in fields:
        fields["random_seed"] = fields.pop("seed")
    return build_command(fields)


def check_sglang_importable(python: str, env: Mapping[str, str] | None = None) -> None:
    """Raise :class:`SGLangNotInstalledError` unless ``python`` can find the sglang package.

    Asked in a subprocess, so it answers for the interpreter and environment that will run the
    server, and never imports SGLang (or torch) here.
    """
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('sglang') is None)"
    try:
        result = subprocess.run(
            [python, "-c", probe],
            env={**os.environ, **(env or {})},
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SGLangNotInstalledError(f"cannot run {python} to look for sglang: {exc}") from exc
    if result.returncode != 0:
        raise SGLangNotInstalledError(
            f"sglang is not importable by {python}: {INSTALL_HINT} "
            "(SGLang needs a CUDA GPU; on CPU use the embedded backend)"
        )


def original_logprob_set(env: Mapping[str, str]) -> str | None:
    """Why ``env`` would make SGLang report another distribution's log-probs (see
    :data:`LOGPROB_ENV`); ``None`` when it does not."""
    value = env.get("SGLANG_RETURN_ORIGINAL_LOGPROB", "")
    if value.strip().lower() not in ("1", "true", "yes", "y"):
        return None
    return (
        f"SGLANG_RETURN_ORIGINAL_LOGPROB={value} makes SGLang report log-probs at temperature 1, "
        "which the trainer does not recompute at another temperature; unset it"
    )


def why_not_runnable(python: str | None = None) -> str | None:
    """``None`` when this machine can serve with SGLang from ``python``; else why not, and the
    fix. SGLang serves only on CUDA GPUs (its package may be installed without them: areal's
    tests check command lines and request bodies with it)."""
    from areal.plugins.inference.vllm_backend import has_cuda

    if (why := original_logprob_set(os.environ)) is not None:
        return why
    if not has_cuda():
        return "SGLang serves only on CUDA GPUs and this machine has none"
    try:
        check_sglang_importable(python or sys.executable)
    except SGLangNotInstalledError as err:
        return str(err)
    return None


def launch(
    config: SGLangServerConfig | Mapping[str, Any],
    log_path: str | os.PathLike[str],
    *,
    timeout: float = 900.0,
    env: Mapping[str, str] | None = None,
) -> ServerProcess:
    """Start SGLang and return once ``/health`` answers; the process is stopped on failure.

    Loading weights and capturing CUDA graphs takes minutes on a large model, hence the
    generous default ``timeout``. ``env`` is added to this environment, with :data:`LOGPROB_ENV`
    over both.
    """
    cfg = _as_config(config)
    env = {**(env or {}), **LOGPROB_ENV}
    check_sglang_importable(cfg.python_executable or sys.executable, env)
    if cfg.port == 0:  # on a free port, another one if that is taken before SGLang binds it
        local = urllib.parse.urlsplit(cfg.url).hostname or "127.0.0.1"
        return start_on_free_port(
            lambda port: build_command(cfg.model_copy(update={"port": port})),
            host=local,
            log_path=log_path,
            timeout=timeout,
            env=env,
            name="sglang",
        )
    server = ServerProcess(build_command(cfg), log_path=log_path, env=env, name="sglang")
    server.start()
    try:
        server.wait_healthy(cfg.url, timeout)
    except BaseException:
        server.stop()
        raise
    return server
