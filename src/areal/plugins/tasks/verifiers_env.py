"""``verifiers``: the tasks of a `verifiers <https://github.com/PrimeIntellect-ai/verifiers>`_
environment, each played by the environment's own rollout and scored by its own rewards.

verifiers 0.4.0 (its stack is ``verifiers.v1``) builds an environment (``vf.Env``) from a taskset
id: a taskset's rows are the tasks, its harness (a chat program, by default verifiers' own) plays
one, every model call goes through verifiers' interception server to an OpenAI-compatible
endpoint, and the task's ``@vf.reward`` functions score the trace. Here that endpoint is areal's
gateway with the episode's key, so every call of the rollout is recorded for training, and the
reward is the environment's own: nothing of the environment is changed or re-implemented.

``dataset.options``:

- ``environment`` (required): a verifiers taskset id, as ``vf-eval`` takes it (an importable
  module or installed environment exporting a ``vf.Taskset``; it must load offline), or
  ``"module:attr"`` naming a ``vf.Env`` or a function that returns one.
- ``config``: fields of the environment's ``EnvConfig`` (with a taskset id only), e.g.
  ``{agent: {max_turns: 4}}``.
- ``shuffle`` (default true): each pass over the rows in its own order, drawn from
  ``dataset.seed`` and the pass, so task ``i`` is the same row on every machine.
- ``success_reward``: a reward at which an episode counts as solved (the run reports the rate).

What runs where: the rollout worker imports verifiers (never ``import areal``), builds the
environment once per process, and for each episode runs ``Env.run_episode`` inside the
environment's own serving context (its interception server and tool servers, on 127.0.0.1). The
harness's chat program and the taskset's tool servers run as the worker's child processes.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import sys
import uuid
from collections.abc import Mapping
from dataclasses import replace
from functools import cache
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from areal.core.config import ConfigError
from areal.core.tasks import TaskSet, load_object

if TYPE_CHECKING:
    from areal.core.episode import Episode

NAME = "verifiers"
DESCRIPTION = "A verifiers environment's tasks, rollout and rewards (dataset.options.environment)."
SUCCESS_REWARD = None
OPTIONS = ("environment", "config", "shuffle", "success_reward")
INSTALL = "pip install --no-deps verifiers==0.4.0, then the packages docs/tasks.md lists"
# The chat programs verifiers bundles (its ``null`` and ``bash`` harnesses) declare these.
CHAT_PROGRAM_PACKAGES = ("openai", "mcp", "httpx", "httpx2", "tenacity", "certifi")


class VerifiersEpisodeError(RuntimeError):
    """The environment's rollout failed (its errors, as verifiers recorded them): the episode
    is discarded rather than trained on with a reward nobody computed."""


# --- the task set --------------------------------------------------------------------------


def task(index: int, seed: int) -> dict[str, Any]:
    """The unconfigured task set has no environment to draw rows from."""
    raise ConfigError(
        "dataset.options.environment: the verifiers task set needs an environment "
        "(a verifiers taskset id, or 'module:attr' of a vf.Env)"
    )


def configure(options: Mapping[str, Any]) -> TaskSet:
    """The task set over the environment ``options`` names (module docstring); the environment
    is built here once, so a wrong option fails the run before any process starts."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(
            f"dataset.options.{unknown[0]}: the verifiers task set takes no such option "
            f"(it takes: {', '.join(OPTIONS)})"
        )
    spec = _spec(options)
    rows = _rows(spec)
    if not rows:
        raise ConfigError(
            f"dataset.options.environment: {spec['environment']!r} has no tasks; "
            "give an environment whose taskset yields at least one"
        )
    success = options.get("success_reward")
    if success is not None and (isinstance(success, bool) or not isinstance(success, int | float)):
        raise ConfigError(f"dataset.options.success_reward: a number, got {success!r}")
    shuffle = options.get("shuffle", True)
    if not isinstance(shuffle, bool):
        raise ConfigError(f"dataset.options.shuffle: true or false, got {shuffle!r}")

    def configured_task(index: int, seed: int) -> dict[str, Any]:
        return row_task(spec, rows, index, seed, shuffle=shuffle)

    return replace(
        TASK_SET,
        task=configured_task,
        success_reward=float(success) if success is not None else None,
    )


def row_task(
    spec: Mapping[str, Any], rows: list[Any], index: int, seed: int, *, shuffle: bool = True
) -> dict[str, Any]:
    """Task ``index``: row ``order[index % n]`` of pass ``index // n``, where each pass's order
    is a permutation drawn from ``(seed, pass)``, so every pass visits every row once."""
    epoch, offset = divmod(index, len(rows))
    order = list(range(len(rows)))
    if shuffle:
        random.Random(f"{NAME}:{seed}:{epoch}").shuffle(order)
    row = rows[order[offset]]
    return {
        "task_id": f"{NAME}-{seed}-{index}",
        "question": row.data.prompt_text,  # for people reading the logs; the rollout reads the row
        "row": order[offset],
        "verifiers": dict(spec),
    }


def _spec(options: Mapping[str, Any]) -> dict[str, Any]:
    environment = options.get("environment")
    if not isinstance(environment, str) or not environment.strip():
        raise ConfigError(
            "dataset.options.environment: name the environment, a verifiers taskset id or "
            f"'module:attr' of a vf.Env (got {environment!r})"
        )
    config = options.get("config") or {}
    if not isinstance(config, Mapping):
        raise ConfigError(f"dataset.options.config: a mapping of EnvConfig fields, got {config!r}")
    if config and ":" in environment:
        raise ConfigError(
            "dataset.options.config: only a taskset id is built from a config; "
            f"{environment!r} builds its own vf.Env (remove dataset.options.config)"
        )
    return {"environment": environment.strip(), "config": dict(config)}


# --- the environment, once per process -----------------------------------------------------


def environment(spec: Mapping[str, Any]) -> Any:
    """The ``vf.Env`` ``spec`` names, built once per process (the rollout worker's episodes
    share it, as verifiers' own runner shares one env across rollouts)."""
    return _environment(spec["environment"], json.dumps(spec.get("config") or {}, sort_keys=True))


@cache
def _environment(ref: str, config_json: str) -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError:
        raise ConfigError(
            f"dataset.options.environment: verifiers is not installed: {INSTALL}"
        ) from None
    _use_this_python_for_chat_programs()
    if ":" in ref:
        found = load_object(ref)
        built = found() if callable(found) and not isinstance(found, vf.Env) else found
        if not isinstance(built, vf.Env):
            raise ConfigError(
                f"dataset.options.environment: {ref!r} is {type(built).__name__}, "
                "not a vf.Env or a function returning one"
            )
        return built
    try:
        config = vf.resolve_env_config({**json.loads(config_json), "taskset": {"id": ref}})
        return vf.load_environment(config)
    except ModuleNotFoundError as err:
        raise ConfigError(
            f"dataset.options.environment: no verifiers taskset {ref!r} ({err}); install the "
            "environment's package, or give 'module:attr' of a vf.Env"
        ) from None
    except (TypeError, ValueError, AttributeError) as err:
        raise ConfigError(
            f"dataset.options.environment: {ref!r} cannot be built: {err}".splitlines()[0]
        ) from None


def _rows(spec: Mapping[str, Any]) -> list[Any]:
    """The environment's task rows, in its taskset's order (each with its ``idx``)."""
    env = environment(spec)
    if not env.taskset.bounded:
        raise ConfigError(
            f"dataset.options.environment: {spec['environment']!r} has an infinite taskset; "
            "areal indexes a finite one (bound it in the environment, e.g. with take(n))"
        )
    return _loaded_rows(env)


_ROWS: dict[int, list[Any]] = {}


def _loaded_rows(env: Any) -> list[Any]:
    if id(env) not in _ROWS:
        _ROWS[id(env)] = list(env.taskset)
    return _ROWS[id(env)]


def _use_this_python_for_chat_programs() -> None:
    """Run verifiers' bundled chat programs with this interpreter when it holds their packages.

    verifiers prepares a harness's program (a PEP 723 script) with ``uv sync``, which downloads
    its packages at the first rollout. A rollout worker reaches nothing but 127.0.0.1, and this
    interpreter already has them, so the prepared-script cache verifiers keeps is filled with it
    (the script written where verifiers would write it); a missing package leaves verifiers'
    own preparation in place.
    """
    if not all(find_spec(package) for package in CHAT_PROGRAM_PACKAGES):
        return
    from pathlib import Path

    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    data = CHAT_PROGRAM_SOURCE.encode()
    path = Path(SubprocessRuntime.scripts_dir) / f"{hashlib.sha256(data).hexdigest()}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_bytes() != data:
        tmp = path.with_suffix(f".{uuid.uuid4().hex}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    SubprocessRuntime._interpreters.setdefault(str(path), sys.executable)


# --- the agent -----------------------------------------------------------------------------


async def run_row(episode: Episode) -> Any:
    """The environment's own episode (a ``vf.Episode``) of the task's row, every model call
    sent to the gateway with this episode's key."""
    import verifiers.v1 as vf

    env = environment(episode.task["verifiers"])
    row = _loaded_rows(env)[int(episode.task["row"])]
    # verifiers reads an endpoint's key from an environment variable when it builds the
    # endpoint's client; a name of this episode's own keeps concurrent episodes apart (and
    # "API_KEY" in it keeps it out of the harness's processes, which verifiers filters).
    key_var = f"AREAL_VERIFIERS_API_KEY_{uuid.uuid4().hex}"
    client = vf.EvalClientConfig(base_url=episode.base_url, api_key_var=key_var)
    context = vf.ModelContext(model=episode.model, client=client)
    # ``serving()`` keeps its interception server on the env object, so each episode serves
    # from a shallow copy of its own (the taskset and harnesses stay shared).
    own = copy.copy(env)
    os.environ[key_var] = episode.api_key
    try:
        async with own.serving():
            return await own.run_episode(row, context)
    finally:
        os.environ.pop(key_var, None)


def reward_of(result: Any) -> float:
    """The reward of a finished ``vf.Episode``: its trainable traces' rewards, as the task's
    ``@vf.reward`` functions recorded them (the mean, for an env with several such seats)."""
    if not result.ok:
        errors = [f"{e.type}: {e.message}" for e in result.errors]
        errors += [f"{e.type}: {e.message}" for t in result.traces for e in t.errors]
        raise VerifiersEpisodeError("; ".join(errors) or "the verifiers episode failed")
    trainable = [trace for trace in result.traces if trace.agent.trainable] or result.traces
    return float(sum(trace.reward for trace in trainable) / len(trainable))


async def agent(episode: Episode) -> float:
    """The task set's agent (an :data:`areal.core.episode.AgentFn`): the environment's rollout
    of the row, scored by the environment."""
    return reward_of(await run_row(episode))


TASK_SET = TaskSet(
    name=NAME,
    description=DESCRIPTION,
    task=task,
    agent=f"{__name__}:agent",
    success_reward=SUCCESS_REWARD,
    configure=configure,
)
