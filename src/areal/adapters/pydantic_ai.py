"""``pydantic_ai``: agents built on Pydantic AI (``pydantic-ai-slim[openai,anthropic]``) run against
their episode's gateway session, over Chat Completions (``OpenAIChatModel``, the default) or the
Anthropic Messages API (``AnthropicModel``, with ``protocol="anthropic"``).

Two shapes of agent:

- a function ``(task, llm, **extras)`` (or an object with ``run(task, **kw)``), sync or async:
  ``llm`` is a Pydantic AI ``Model`` bound to the episode, for ``Agent(llm, ...)`` or
  ``agent.run(prompt, model=llm)``; a sync agent runs ``agent.run_sync(...)`` in a worker thread.
  As with every adapter, the extra ``model`` is the policy's model id (a string), so name the
  second parameter anything but ``model``;
- a ``pydantic_ai.Agent``, built on any model: each episode runs it on the episode's model
  (``agent.run(prompt, model=...)``) with the task's ``prompt`` or ``question``, at most
  ``max_turns`` model requests; its output is the answer (a structured output as JSON text, no
  answer when the requests ran out).

The model's SDK client does not retry (a retry would be recorded as a turn). Code that builds its
own model from a name (``Agent("anthropic:<policy>")``) reaches its own episode too: the providers
read ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` and ``ANTHROPIC_BASE_URL``/``ANTHROPIC_API_KEY``, which
are per-episode values here (:mod:`areal.adapters.env`); those clients keep the SDKs' retries.

The gateway answers ``output_config.format`` (Anthropic's structured output) for every model, so the
Anthropic model's profile says so (``NativeOutput`` works on both protocols); ``profile=`` adds to
or replaces the profile. Other options go to the SDK client (``timeout=30``, say).

Telemetry: Pydantic AI exports OpenTelemetry spans (to Logfire or any OTel backend) only when
instrumentation is turned on (``capabilities=[Instrumentation()]``, ``Agent.instrument_all()``,
``logfire.instrument_pydantic_ai()``). The adapter never turns it on and hands out uninstrumented
models; where spans go once a user turns it on is the user's OpenTelemetry setup. The Anthropic
SDK traces its own calls to the globally registered tracer provider unless told not to: in an
episode it is told not to (``ANTHROPIC_OPEN_TELEMETRY=false``) unless the environment says
otherwise, or the adapter is given the SDK's ``open_telemetry=`` option.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
from collections.abc import Mapping
from typing import Any, Literal

from areal.adapters.base import Adapter, AdapterError, LibraryAdapter, Result
from areal.adapters.env import episode_env
from areal.core.episode import Episode, gateway_root, loop_http_pool

INSTALL = "the pydantic_ai adapter needs Pydantic AI: pip install 'areal[pydantic-ai]'"
Protocol = Literal["openai", "anthropic"]
PROTOCOLS = ("openai", "anthropic")
# What the gateway serves whatever the model's name (Pydantic AI knows it only for Claude models).
GATEWAY_PROFILE: dict[Protocol, dict[str, Any]] = {
    "openai": {},
    "anthropic": {"supports_json_schema_output": True},
}


class PydanticAIAdapter(LibraryAdapter):
    framework = "pydantic_ai"

    @staticmethod
    def accepts(agent: Any) -> bool:
        """A ``pydantic_ai.Agent``: what the built-in guess may route here."""
        return _is_pydantic_agent(agent)

    def __init__(
        self, agent: Any, *, protocol: Protocol = "openai", profile: Any = None, **options: Any
    ) -> None:
        if protocol not in PROTOCOLS:
            raise AdapterError(f"protocol must be 'openai' or 'anthropic', got {protocol!r}")
        _model_classes(protocol)  # fail at wrap time, not in every episode
        self.protocol = protocol
        self.profile = profile
        self.pydantic_agent = _is_pydantic_agent(agent)
        if self.pydantic_agent:  # run by the adapter, not called: no signature to check
            options.pop("agent_config", None)
            Adapter.__init__(self, agent, **options)
        else:
            super().__init__(agent, **options)

    def environment(self, episode: Episode) -> dict[str, str]:
        # Both providers', so a model built from either name reaches the episode; the auth token
        # too, or the Anthropic SDK could send a machine's ANTHROPIC_AUTH_TOKEN.
        root, key = gateway_root(episode.base_url), episode.api_key
        env = {
            "OPENAI_BASE_URL": episode.base_url,
            "OPENAI_API_KEY": key,
            "ANTHROPIC_BASE_URL": root,
            "ANTHROPIC_API_KEY": key,
            "ANTHROPIC_AUTH_TOKEN": key,
        }
        if "ANTHROPIC_OPEN_TELEMETRY" not in os.environ:  # the SDK's own spans: off unless asked
            env["ANTHROPIC_OPEN_TELEMETRY"] = "false"
        return env

    def model(self, episode: Episode, sdk_client: Any) -> Any:
        """The episode's Pydantic AI ``Model`` on ``sdk_client`` (an ``AsyncOpenAI`` or
        ``AsyncAnthropic`` bound to the session)."""
        model_class, provider_class = _model_classes(self.protocol)
        if self.protocol == "anthropic":
            provider = provider_class(anthropic_client=sdk_client)
        else:
            provider = provider_class(openai_client=sdk_client)
        return model_class(episode.model, provider=provider, profile=self._profile())

    # Clients are built inside the episode's environment (LibraryAdapter.agent_fn), so the SDKs'
    # own reads of the environment see the session, not the machine.
    def async_client(self, episode: Episode) -> Any:
        return self.model(episode, self._sdk_client(episode, shared_pool=True))

    def sync_client(self, episode: Episode) -> Any:
        """For a sync agent, in its worker thread: ``run_sync`` drives the thread's event loop,
        so the thread gets a loop of its own and the client a pool of its own, closed on it."""
        model = self.model(episode, self._sdk_client(episode, shared_pool=False))
        _thread.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(_thread.loop)
        return model

    async def close_async(self, client: Any) -> None:
        await client.client.close()  # the shared pool outlives it

    def close_sync(self, client: Any) -> None:
        loop = _thread.loop
        try:
            # An agent that ran the client on a loop of its own (asyncio.run) has closed that
            # loop, and its connections with it: closing them again raises RuntimeError.
            with contextlib.suppress(RuntimeError):
                loop.run_until_complete(client.client.close())
        finally:
            asyncio.set_event_loop(None)
            loop.close()

    async def agent_fn(self, episode: Episode) -> Result:
        if not self.pydantic_agent:
            return await super().agent_fn(episode)
        from pydantic_ai import UsageLimitExceeded, UsageLimits

        with episode_env(self.environment(episode)):
            model = self.async_client(episode)
            try:
                run = await self.agent.run(
                    _prompt(episode.task),
                    model=model,
                    usage_limits=UsageLimits(request_limit=episode.max_turns),
                )
            except UsageLimitExceeded:
                return ""  # no answer: scored, not discarded
            finally:
                await self.close_async(model)
        return self.result(run)

    def result(self, out: Any) -> Result:
        """A run's output (a structured one as JSON text), or what the agent returned."""
        from pydantic import BaseModel
        from pydantic_ai import AgentRunResult

        if isinstance(out, AgentRunResult):
            out = out.output
        if isinstance(out, BaseModel):
            return out.model_dump_json()
        if isinstance(out, Mapping | list):
            return json.dumps(out)
        return out  # type: ignore[no-any-return]

    def _profile(self) -> Any:
        default = GATEWAY_PROFILE[self.protocol]
        if self.profile is None:
            return default or None
        if isinstance(self.profile, Mapping):
            return {**default, **self.profile}
        return self.profile  # a callable: the user's full control

    def _sdk_client(self, episode: Episode, *, shared_pool: bool) -> Any:
        options: dict[str, Any] = {"api_key": episode.api_key, "max_retries": 0, **self.options}
        if self.protocol == "anthropic":
            import anthropic

            if shared_pool:
                pool = loop_http_pool("anthropic", anthropic.DefaultAsyncHttpxClient)
                options.setdefault("http_client", pool)
            return anthropic.AsyncAnthropic(base_url=gateway_root(episode.base_url), **options)
        if shared_pool:
            return episode.openai_client(**self.options)
        import openai

        return openai.AsyncOpenAI(base_url=episode.base_url, **options)


class _ThreadLoop(threading.local):
    loop: asyncio.AbstractEventLoop


_thread = _ThreadLoop()  # a sync agent's event loop, from sync_client to close_sync


def _prompt(task: Mapping[str, Any]) -> str:
    for key in ("prompt", "question"):
        if isinstance(task.get(key), str):
            return str(task[key])
    raise AdapterError("a pydantic_ai.Agent needs a task with a 'prompt' or 'question' string")


def _is_pydantic_agent(agent: Any) -> bool:
    try:
        from pydantic_ai import Agent
    except ImportError:
        return False
    return isinstance(agent, Agent)


def _model_classes(protocol: Protocol) -> tuple[Any, Any]:
    """The model and provider classes of ``protocol`` (its SDK is an extra of pydantic-ai-slim)."""
    try:
        if protocol == "anthropic":
            from pydantic_ai.models.anthropic import AnthropicModel
            from pydantic_ai.providers.anthropic import AnthropicProvider

            return AnthropicModel, AnthropicProvider
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        return OpenAIChatModel, OpenAIProvider
    except ImportError as err:
        raise AdapterError(INSTALL) from err
