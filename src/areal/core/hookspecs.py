"""Every areal hook, documented.

Hooks are called with keyword arguments only; they may gain arguments over time and never lose or
rename one. "Register" hooks receive a ``register(name, thing)`` callback rather than returning
values, so one plugin can register many things and duplicates are caught in one place
(:mod:`areal.core.registry`). Hooks fill registries at start-up; hot loops never call pluggy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

PROJECT_NAME = "areal"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

Register = Callable[..., None]


# --- models and inference -------------------------------------------------------------------


@hookspec
def areal_register_model_families(register: Register) -> None:
    """Register decoder model families: ``register(name, ModelFamily(...))``.

    A family maps Hugging Face ``model_type`` values to a torch module loaded lazily, so listing
    families never imports torch.
    """


@hookspec
def areal_register_inference_backends(register: Register) -> None:
    """Register inference backends (the embedded torch engine, SGLang):
    ``register(name, InferenceBackend(...))``."""


@hookspec
def areal_register_launchers(register: Register) -> None:
    """Register launchers, which place a run's processes (this machine, a Ray cluster, a Slurm
    allocation): ``register(name, LauncherSpec(...))`` (:mod:`areal.core.launcher`).
    ``launcher.name`` picks one."""


@hookspec
def areal_register_tool_parsers(register: Register) -> None:
    """Register parsers that turn generated text into tool calls, one per chat-template family:
    ``register(name, parser_factory)``."""


# --- training -------------------------------------------------------------------------------


@hookspec
def areal_register_engines(register: Register) -> None:
    """Register training engines (the PyTorch-native 5D engine is ``fsdp``):
    ``register(name, TrainEngineSpec(...))`` (:class:`areal.core.specs.TrainEngineSpec`).

    An engine is one bundle: the model families it trains, its ``parallelize_*`` function, its
    train step, and the ``build``/``follow`` entry points a run calls with the config sections the
    engine owns (:mod:`areal.core.train_engine`). ``train.engine`` picks one by name.
    """


@hookspec
def areal_register_losses(register: Register) -> None:
    """Register policy losses: ``register(name, loss_fn)``; a loss is a pure function over tensors."""


@hookspec
def areal_register_rewards(register: Register) -> None:
    """Register reward functions: ``register(name, reward_fn)``; may return an awaitable."""


@hookspec
def areal_register_queues(register: Register) -> None:
    """Register trajectory queue transports (ZeroMQ by default): ``register(name, factory)``."""


@hookspec
def areal_register_metric_sinks(register: Register) -> None:
    """Register metric sinks (jsonl, TensorBoard, train.log): ``register(name, factory)``."""


# --- agents ---------------------------------------------------------------------------------


@hookspec
def areal_register_task_sets(register: Register) -> None:
    """Register built-in datasets (``dataset.name`` in a run config):
    ``register(name, TaskSet(...))`` (:class:`areal.core.tasks.TaskSet`).

    A task set generates its tasks from ``(index, seed)``, names its agent as ``"module:attr"``
    (imported only when a run needs it) and may give format demonstrations for a warm start.
    """


@hookspec
def areal_register_adapters(register: Register) -> None:
    """Register agent adapters by framework name (``agent.framework`` in a run config):
    ``register(name, adapter_factory)``."""


@hookspec(firstresult=True)
def areal_wrap_agent(agent: Any, options: dict[str, Any]) -> Any:
    """Who wraps this agent? Return an adapter for ``agent``, or None to let another plugin try.

    Used by :func:`areal.wrap`; the first non-None answer wins, so a third-party adapter plugs in
    the same way as the built-ins.
    """


# --- command line ---------------------------------------------------------------------------


@hookspec
def areal_register_monitor_panels(register: Register) -> None:
    """Add panels to the live monitor (``areal monitor``, ``areal train`` on a terminal):
    ``register(name, render)``, where ``render(view)`` returns a rich renderable.

    ``view`` is the monitor's read-only state, built from the run's published events:
    ``view.latest(event) -> dict`` (the newest values of an event such as ``"train"``) and
    ``view.series(event, key) -> list[float]`` (that key's history, oldest first). ``render`` is
    called on every refresh, so it must be cheap and must not raise for missing keys.
    """


@hookspec
def areal_register_commands(cli: Any) -> None:
    """Add commands or command groups to the ``areal`` typer app (``cli.add_typer(...)``,
    ``cli.command()(...)``). Heavy imports belong inside the commands, not at module level."""
