"""``langchain``: a function handed the episode's ``ChatOpenAI`` (tool calling included), and
runnables built on someone else's chat model, rebound to the gateway per episode."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

import areal
from areal.adapters.langchain import LangChainAdapter


class Digit(BaseModel):
    """The tool's argument: one digit, so the untrained policy finishes the call at once."""

    d: int = Field(ge=0, le=9)


@tool(args_schema=Digit)
def square(d: int) -> int:
    """Square a digit."""
    return d * d


def answer_length(completion: str, task: Any) -> float:
    return 1.0 if isinstance(completion, str) else 0.0


def test_function_agent_with_tool_calls(gateway: Any, tasks: Any) -> None:
    async def agent(task: dict[str, Any], llm: Any) -> float:
        assert isinstance(llm, ChatOpenAI) and llm.max_retries == 0
        bound = llm.bind_tools([square], tool_choice="square").bind(max_tokens=64)
        reply = await bound.ainvoke(task["question"])
        call = reply.tool_calls[0]  # parsed by the gateway, seen through LangChain
        assert call["name"] == "square" and 0 <= call["args"]["d"] <= 9
        return float(task["r"])

    stats, got = gateway.run(areal.wrap(agent, framework="langchain"), tasks)
    assert (stats.finished, stats.failed) == (4, 0), stats.errors
    assert {k: t.reward for k, t in got.items()} == {"t0": 0.0, "t1": 0.25, "t2": 0.5, "t3": 0.75}


def test_runnables_are_rebound_to_the_gateway(gateway: Any, tasks: Any) -> None:
    """Built against a server that does not exist; each episode swaps in its own ChatOpenAI, and
    what the chain answers is scored by the reward function."""
    elsewhere = ChatOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", model="gpt-x")
    chain = ChatPromptTemplate.from_messages([("user", "{question}")]) | elsewhere.bind(
        max_tokens=3
    )
    adapter = areal.wrap(chain)
    assert isinstance(adapter, LangChainAdapter)
    stats, got = gateway.run(adapter, tasks[:2], reward_fn=answer_length)
    assert (stats.finished, stats.failed) == (2, 0), stats.errors
    assert [t.reward for t in got.values()] == [1.0, 1.0]
    assert all(t.completions == 1 for t in got.values())

    bare = areal.wrap(elsewhere, max_tokens=3)  # a chat model alone gets the task's question
    stats, _ = gateway.run(bare, tasks[2:], reward_fn=answer_length)
    assert (stats.finished, stats.rewards) == (2, [1.0, 1.0])


def test_results_become_text() -> None:
    adapter = LangChainAdapter(lambda task, llm: None)
    assert adapter.result(AIMessage("42")) == "42"
    assert adapter.result({"messages": [AIMessage("a"), AIMessage("b")]}) == "b"
    assert adapter.result(0.5) == 0.5
