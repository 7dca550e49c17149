"""``openai_agents``: agents built on the OpenAI Agents SDK (``openai-agents``, imported as
``agents``) run against their episode's gateway session, over the Responses API (the SDK's
default) or Chat Completions.

Two shapes of agent:

- a function ``(task, client, **extras)`` (or an object with ``run(task, **kw)``) that runs the SDK
  itself: ``Runner.run`` or ``run_streamed``, or ``Runner.run_sync`` in a sync function (run in a
  worker thread, on an event loop of its own). ``client`` is an ``AsyncOpenAI`` bound to the
  episode, for ``OpenAIResponsesModel(model=..., openai_client=client)`` or
  ``OpenAIChatCompletionsModel``; besides the usual extras (``model``, ``episode``, ``max_turns``,
  ``config``) it may ask for ``run_config``: a ``RunConfig`` whose model provider uses that client
  (``Runner.run(agent, input, run_config=run_config)``);
- an ``agents.Agent``: run with the task's ``messages``, ``prompt`` or ``question`` as input and the
  episode's ``max_turns``; its final output is the answer (a structured output as JSON text). A
  run the policy ends without an answer is answered ``""``, scored rather than discarded: out of
  turns, or the SDK's ``ModelBehaviorError`` at what the policy wrote (an answer cut at
  ``max_tokens``, which the SDK fails on the Responses API; JSON that is not the output type's).

Code that passes no ``run_config`` still reaches its own episode: the SDK builds its client when a
run first needs it, from ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``, and an agent without a model
uses ``OPENAI_DEFAULT_MODEL``; all three are per-episode values here (:mod:`areal.adapters.env`),
the last one the policy's model id. Such a client takes its connections from the episode's HTTP
pool rather than the SDK's process-wide one, which belongs to the first event loop that used it
and so fails a sync agent's episodes (each on a loop of its own). Two limits of that path: a
``RunConfig`` or provider built once outside the episodes keeps the client of the first episode
that used it, and a client the SDK builds retries failed calls (the ``openai`` default), each
retry a recorded turn. The ``client`` and ``run_config`` handed in do not retry.

``api``: ``"responses"`` or ``"chat_completions"`` for ``run_config``'s provider; by default the
SDK's own (``agents.set_default_openai_api``).

Tracing: the SDK exports a trace of every run to api.openai.com unless told not to. The adapter
turns tracing off for the process (``agents.set_tracing_disabled(True)``, and ``tracing_disabled``
in ``run_config``) unless it is wrapped with ``tracing=True``; then the SDK's own setup applies:
its exporter to OpenAI (with the machine's ``OPENAI_API_KEY``) or the processors installed with
``agents.set_trace_processors`` (an OpenTelemetry exporter, say).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any, Literal

from areal.adapters.base import Adapter, AdapterError, LibraryAdapter, Result, bind, call_agent
from areal.adapters.env import episode_env
from areal.core.episode import Episode, shared_http_client

INSTALL = (
    "the openai_agents adapter needs the OpenAI Agents SDK: pip install 'areal[openai-agents]'"
)
Api = Literal["responses", "chat_completions"]

# The HTTP pool of the current episode, for the clients the SDK builds itself.
_POOL: ContextVar[Any] = ContextVar("areal_openai_agents_pool", default=None)


class OpenAIAgentsAdapter(LibraryAdapter):
    framework = "openai_agents"

    @staticmethod
    def accepts(agent: Any) -> bool:
        """An ``agents.Agent``: what the built-in guess may route here."""
        return _is_sdk_agent(agent)

    def __init__(
        self, agent: Any, *, api: Api | None = None, tracing: bool = False, **options: Any
    ) -> None:
        _sdk()  # fail at wrap time, not in every episode
        if api not in (None, "responses", "chat_completions"):
            raise AdapterError(f"api must be 'responses' or 'chat_completions', got {api!r}")
        self.sdk_agent = _is_sdk_agent(agent)
        self.api = api
        self.tracing = tracing
        if self.sdk_agent:  # run by the adapter, not called: no signature to check
            options.pop("agent_config", None)
            Adapter.__init__(self, agent, **options)
        else:
            super().__init__(agent, **options)

    def environment(self, episode: Episode) -> dict[str, str]:
        return {
            "OPENAI_BASE_URL": episode.base_url,
            "OPENAI_API_KEY": episode.api_key,
            "OPENAI_DEFAULT_MODEL": episode.model,
        }

    def async_client(self, episode: Episode) -> Any:
        return episode.openai_client(**self.options)

    def run_config(self, client: Any) -> Any:
        """Every agent of a run on ``client``, with the adapter's API and tracing choice."""
        from agents import MultiProvider, RunConfig

        use_responses = None if self.api is None else self.api == "responses"
        provider = MultiProvider(openai_client=client, openai_use_responses=use_responses)
        return RunConfig(model_provider=provider, tracing_disabled=not self.tracing)

    async def agent_fn(self, episode: Episode) -> Result:
        if not self.tracing:
            _sdk().set_tracing_disabled(True)
        with episode_env(self.environment(episode)):
            if self.sdk_agent or self.is_async:
                client = self.async_client(episode)
                try:
                    with episode_pool(shared_http_client()):
                        out = await self._run_async(episode, client)
                finally:
                    await client.close()
            else:
                out = await asyncio.to_thread(self._run_in_thread, episode)
        return self.result(out)

    async def _run_async(self, episode: Episode, client: Any) -> Any:
        if not self.sdk_agent:
            extras = {**self.extras(episode), "run_config": self.run_config(client)}
            return await call_agent(self.target, episode.task, client, extras)
        sdk = _sdk()
        try:
            return await sdk.Runner.run(
                self.agent,
                _input(episode.task),
                max_turns=episode.max_turns,
                run_config=self.run_config(client),
            )
        except (sdk.MaxTurnsExceeded, sdk.ModelBehaviorError):
            return ""  # the policy's doing: scored as no answer, not discarded

    def _run_in_thread(self, episode: Episode) -> Any:
        """A sync agent in a worker thread, on an event loop of its own that ``Runner.run_sync``
        finds; its clients share a pool made for the episode, closed on that loop at the end."""
        import openai

        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        pool = openai.DefaultAsyncHttpxClient()
        options = {"max_retries": 0, "http_client": pool, **self.options}
        client = openai.AsyncOpenAI(base_url=episode.base_url, api_key=episode.api_key, **options)
        try:
            extras = {**self.extras(episode), "run_config": self.run_config(client)}
            args, kwargs = bind(self.target, episode.task, client, extras)
            with episode_pool(pool):
                return self.target(*args, **kwargs)
        finally:
            with contextlib.suppress(RuntimeError):  # connections of a loop the agent closed
                loop.run_until_complete(pool.aclose())
            asyncio.set_event_loop(None)
            loop.close()

    def result(self, out: Any) -> Result:
        """A run's final output (a structured one as JSON text), or what the agent returned."""
        from agents.result import RunResultBase
        from pydantic import BaseModel

        if isinstance(out, RunResultBase):
            out = out.final_output
        if isinstance(out, BaseModel):
            return out.model_dump_json()
        if isinstance(out, Mapping | list):
            return json.dumps(out)
        return out  # type: ignore[no-any-return]


@contextlib.contextmanager
def episode_pool(pool: Any) -> Iterator[None]:
    """Within this block (and the tasks started from it), the clients the SDK builds itself take
    their connections from ``pool``."""
    _hook_sdk_pool()
    token = _POOL.set(pool)
    try:
        yield
    finally:
        _POOL.reset(token)


def _hook_sdk_pool() -> None:
    """Route the SDK's process-wide pool (``agents.models.openai_provider.shared_http_client``,
    read when its provider builds a client) to the episode's, where there is one."""
    from agents.models import openai_provider

    if getattr(openai_provider.shared_http_client, "areal_episode_pool", False):
        return
    process_pool = openai_provider.shared_http_client

    def shared_http_client() -> Any:
        pool = _POOL.get()
        return process_pool() if pool is None else pool

    shared_http_client.areal_episode_pool = True  # type: ignore[attr-defined]
    openai_provider.shared_http_client = shared_http_client


def _input(task: Mapping[str, Any]) -> Any:
    for key in ("messages", "prompt", "question"):
        if key in task:
            return task[key]
    raise AdapterError("an agents.Agent needs a task with 'messages', 'prompt' or 'question'")


def _is_sdk_agent(agent: Any) -> bool:
    try:
        from agents import Agent
    except ImportError:
        return False
    return isinstance(agent, Agent)


def _sdk() -> Any:
    try:
        import agents
    except ImportError as err:
        raise AdapterError(INSTALL) from err
    return agents
