"""What every adapter shares: the :class:`Adapter` contract, calling the user's agent with what
it asks for, and the seed's ``AGENT_CONFIG`` with the episode's URL, key and model filled in.

The user's agent is one of

- a function ``(task, client, **extras) -> reward | answer | None``, sync or async;
- an object with a ``run(task, **kw)`` method (``client`` and the extras by keyword).

The extras are passed only when the function names them (or takes ``**kw``): ``episode`` (the
:class:`~areal.run.rollout.Episode`), ``model`` (the policy's model id), ``max_turns`` and
``config`` (the ``AGENT_CONFIG`` dict with ``model_base_url``, ``api_key`` and ``model_name``
overridden for this episode, every other key kept).
"""

from __future__ import annotations

import asyncio
import inspect
import runpy
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from areal.core.agent_choice import AdapterError
from areal.core.episode import Episode

__all__ = ["Adapter", "AdapterError", "LibraryAdapter", "Result"]

Result = float | str | None


class Adapter:
    """Turns a user's agent into an :data:`~areal.run.rollout.AgentFn`: ``agent_fn(episode)``.

    An adapter is itself an ``AgentFn`` (calling it runs ``agent_fn``), so an entrypoint may name
    an ``areal.wrap(...)`` result directly.

    What choosing an adapter needs to know (:mod:`areal.core.agent_choice`), it declares here:
    ``harness``, the adapter is the agent itself (a CLI harness), so a run without an entrypoint
    runs it by its name (adapters that wrap the user's code say False); ``runs_unchanged``, the
    agent is a plain ``agent(episode)`` run as it is.
    """

    framework = ""
    harness = True
    runs_unchanged = False

    def __init__(self, agent: Any, **options: Any) -> None:
        self.agent = agent
        self.options = options
        # Added to the body of every session the rollout worker opens for this agent.
        self.session_fields: dict[str, Any] = {}

    async def agent_fn(self, episode: Episode) -> Result:
        raise NotImplementedError

    def __call__(self, episode: Episode) -> Any:
        return self.agent_fn(episode)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.agent!r})"


class LibraryAdapter(Adapter):
    """An in-process agent handed a client of one library, bound to the episode's session.

    ``agent_config``: the seed's ``AGENT_CONFIG`` (a dict, or the path of an ``agent_config.py``);
    every other option goes to the client's constructor (e.g. ``timeout``).
    """

    harness = False  # wraps the user's agent

    def __init__(
        self,
        agent: Any,
        *,
        agent_config: Mapping[str, Any] | str | Path | None = None,
        **options: Any,
    ) -> None:
        super().__init__(agent, **options)
        self.target = entry(agent)
        bind(self.target, {}, None, {})  # a wrong shape fails at wrap time, not per episode
        self.is_async = is_async(self.target)
        self.agent_config = load_agent_config(agent_config)

    # What a library adapter provides.
    def base_url(self, episode: Episode) -> str:
        return episode.base_url

    def environment(self, episode: Episode) -> dict[str, str]:
        return {}

    def async_client(self, episode: Episode) -> Any:
        raise NotImplementedError

    def sync_client(self, episode: Episode) -> Any:
        raise NotImplementedError

    async def close_async(self, client: Any) -> None:
        await client.close()

    def close_sync(self, client: Any) -> None:
        client.close()

    def result(self, out: Any) -> Result:
        return out  # type: ignore[no-any-return]

    async def agent_fn(self, episode: Episode) -> Result:
        from areal.adapters.env import episode_env

        extras = self.extras(episode)
        with episode_env(self.environment(episode)):
            if self.is_async:
                client = self.async_client(episode)
                try:
                    out = await call_agent(self.target, episode.task, client, extras)
                finally:
                    await self.close_async(client)
            else:
                out = await asyncio.to_thread(self._run_sync, episode, extras)
        return self.result(out)

    def _run_sync(self, episode: Episode, extras: dict[str, Any]) -> Any:
        client = self.sync_client(episode)
        try:
            args, kwargs = bind(self.target, episode.task, client, extras)
            return self.target(*args, **kwargs)
        finally:
            self.close_sync(client)

    def extras(self, episode: Episode) -> dict[str, Any]:
        config = {
            **self.agent_config,
            "model_base_url": self.base_url(episode),
            "api_key": episode.api_key,
            "model_name": episode.model,
            "max_turns": episode.max_turns,
        }
        return {
            "episode": episode,
            "model": episode.model,
            "max_turns": episode.max_turns,
            "config": config,
        }


def entry(agent: Any) -> Callable[..., Any]:
    """The callable to run: ``agent.run`` for an agent object, else the agent itself."""
    run = getattr(agent, "run", None)
    if callable(run) and not inspect.isfunction(agent):
        return run  # type: ignore[no-any-return]
    if callable(agent):
        return agent  # type: ignore[no-any-return]
    raise AdapterError(
        f"cannot run {agent!r}: an agent is a function (task, client) or has a run(task, **kw) method"
    )


def is_async(fn: Callable[..., Any]) -> bool:
    call = getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


async def call_agent(
    fn: Callable[..., Any], task: Any, client: Any, extras: Mapping[str, Any]
) -> Any:
    args, kwargs = bind(fn, task, client, extras)
    out = fn(*args, **kwargs)
    return await out if inspect.isawaitable(out) else out


def bind(
    fn: Callable[..., Any], task: Any, client: Any, extras: Mapping[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """``fn``'s arguments: the task first, the client second (or by the name ``client``), the
    extras by name, everything to ``**kw``."""
    params = list(inspect.signature(fn).parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not positional and not any(p.kind == p.VAR_POSITIONAL for p in params):
        raise AdapterError(f"{fn!r} takes no task argument")
    named = {"client": client, **extras}
    args: list[Any] = [task]
    kwargs: dict[str, Any] = {}
    for i, p in enumerate(positional[1:]):
        if p.name in named:
            kwargs[p.name] = named.pop(p.name)
        elif i == 0:
            args.append(named.pop("client"))
    for p in params:
        if p.kind == p.KEYWORD_ONLY and p.name in named:
            kwargs[p.name] = named.pop(p.name)
    if any(p.kind == p.VAR_KEYWORD for p in params):
        kwargs.update(named)
    return args, kwargs


def load_agent_config(value: Mapping[str, Any] | str | Path | None) -> dict[str, Any]:
    """The seed's ``AGENT_CONFIG``: a dict as is, or read from an ``agent_config.py``."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    found = runpy.run_path(str(value)).get("AGENT_CONFIG")
    if not isinstance(found, Mapping):
        raise AdapterError(f"agent_config: {value} must define AGENT_CONFIG = {{...}}")
    return dict(found)
