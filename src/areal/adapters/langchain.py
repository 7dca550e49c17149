"""``langchain``: LangChain agents get a ``ChatOpenAI`` (langchain-openai) bound to their episode.

Two shapes of agent:

- a function ``(task, llm, **extras)`` (or an object with ``run(task, **kw)``), handed the episode's
  ``ChatOpenAI``, which it may ``bind_tools(...)``: tool calls go through the gateway's OpenAI
  route like any other;
- a ``Runnable`` built on langchain-core chat models (a chat model, ``prompt | llm``,
  ``llm.bind_tools(...)``): each chat model in it is replaced by the episode's ``ChatOpenAI`` (bound
  tools and other bound arguments are kept), and the result is invoked with the task: the task
  dict, or ``task[input_key]`` with ``input_key=...``; a bare chat model gets the task's
  ``messages``, ``prompt`` or ``question``.

What the agent returns becomes the episode's result: a message's text (an answer for the reward
function), a LangGraph-style ``{"messages": [...]}``'s last text, or a reward as is. Other options
go to ``ChatOpenAI`` (e.g. ``max_tokens``). langchain-openai is the extra ``areal[langchain]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from areal.adapters.base import Adapter, AdapterError, LibraryAdapter, Result
from areal.core.episode import Episode, shared_http_client

INSTALL = "the langchain adapter needs langchain-openai: pip install 'areal[langchain]'"


class LangChainAdapter(LibraryAdapter):
    framework = "langchain"

    @staticmethod
    def accepts(agent: Any) -> bool:
        """A LangChain runnable (a chat model, a chain): what the built-in guess routes here."""
        return _is_runnable(agent)

    def __init__(self, agent: Any, *, input_key: str | None = None, **options: Any) -> None:
        _chat_openai()  # fail at wrap time, not in every episode
        self.runnable = _is_runnable(agent)
        self.input_key = input_key
        if self.runnable:  # invoked with the task, not called: no signature to check
            options.pop("agent_config", None)
            Adapter.__init__(self, agent, **options)
        else:
            super().__init__(agent, **options)

    def environment(self, episode: Episode) -> dict[str, str]:
        return {"OPENAI_BASE_URL": episode.base_url, "OPENAI_API_KEY": episode.api_key}

    def async_client(self, episode: Episode) -> Any:
        return self._llm(episode, http_async_client=shared_http_client())

    def sync_client(self, episode: Episode) -> Any:
        return self._llm(episode)

    async def close_async(self, client: Any) -> None:
        return None  # the shared pool outlives the episode

    def close_sync(self, client: Any) -> None:
        return None

    async def agent_fn(self, episode: Episode) -> Result:
        if not self.runnable:
            return await super().agent_fn(episode)
        from langchain_core.language_models import BaseChatModel

        chain = rebind(self.agent, self.async_client(episode))
        if isinstance(self.agent, BaseChatModel):
            given: Any = _text_input(episode.task)
        else:
            given = episode.task if self.input_key is None else episode.task[self.input_key]
        return self.result(await chain.ainvoke(given))

    def result(self, out: Any) -> Result:
        from langchain_core.messages import BaseMessage

        if isinstance(out, Mapping) and isinstance(out.get("messages"), list) and out["messages"]:
            out = out["messages"][-1]
        if isinstance(out, BaseMessage):
            text = out.text  # a str-like property in langchain-core 1.x, a method before
            return str(text) if isinstance(text, str) else str(text())
        return out  # type: ignore[no-any-return]

    def _llm(self, episode: Episode, **extra: Any) -> Any:
        options = {"max_retries": 0, **extra, **self.options}
        return _chat_openai()(
            base_url=episode.base_url, api_key=episode.api_key, model=episode.model, **options
        )


def rebind(runnable: Any, llm: Any) -> Any:
    """``runnable`` with every chat model in it replaced by ``llm`` (bound arguments kept)."""
    from langchain_core.language_models import BaseChatModel
    from langchain_core.runnables import RunnableBinding, RunnableParallel, RunnableSequence

    if isinstance(runnable, BaseChatModel):
        return llm
    if isinstance(runnable, RunnableBinding):
        return runnable.model_copy(update={"bound": rebind(runnable.bound, llm)})
    if isinstance(runnable, RunnableSequence):
        steps = [rebind(step, llm) for step in runnable.steps]
        return RunnableSequence(*steps, name=runnable.name)
    if isinstance(runnable, RunnableParallel):
        return RunnableParallel({k: rebind(v, llm) for k, v in runnable.steps__.items()})
    return runnable


def _is_runnable(agent: Any) -> bool:
    try:
        from langchain_core.runnables import Runnable
    except ImportError:
        return False
    return isinstance(agent, Runnable)


def _text_input(task: Mapping[str, Any]) -> Any:
    for key in ("messages", "prompt", "question"):
        if key in task:
            return task[key]
    raise AdapterError("a chat model agent needs a task with 'messages', 'prompt' or 'question'")


def _chat_openai() -> Any:
    try:
        from langchain_openai import ChatOpenAI
    except ImportError as err:
        raise AdapterError(INSTALL) from err
    return ChatOpenAI
