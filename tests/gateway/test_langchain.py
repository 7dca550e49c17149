"""LangChain's ChatOpenAI, unchanged except for its base URL and key, served by the policy."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field


class Weather(BaseModel):
    """The tool's arguments: bounded, so the untrained policy finishes a call quickly."""

    city: str = Field(max_length=12)
    unit: Literal["celsius", "fahrenheit"]


@tool(args_schema=Weather)
def get_weather(city: str, unit: str) -> str:
    """Weather for a city, in celsius or fahrenheit."""
    return f"3 degrees {unit} in {city}"


class Add(BaseModel):
    """Add two small integers."""

    a: int = Field(ge=0, le=99)
    b: int = Field(ge=0, le=99)


@pytest.fixture(scope="module")
def llm(gateway: Any) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=gateway.v1, api_key=gateway.key, model=gateway.model, max_tokens=16, max_retries=0
    )


def test_invoke(llm: ChatOpenAI, gateway: Any) -> None:
    reply = llm.invoke([HumanMessage("Say hi.")])
    assert isinstance(reply, AIMessage) and isinstance(reply.content, str)
    assert reply.usage_metadata is not None
    prompt = gateway.state.policy.render([{"role": "user", "content": "Say hi."}])
    assert reply.usage_metadata["input_tokens"] == len(prompt)
    assert 0 < reply.usage_metadata["output_tokens"] <= 16
    assert reply.response_metadata["finish_reason"] in ("stop", "length")


def test_stream(llm: ChatOpenAI) -> None:
    chunks = list(llm.stream("Tell me about rivers.", seed=4))
    assert len(chunks) > 2 and all(isinstance(c, AIMessageChunk) for c in chunks)
    whole = llm.invoke("Tell me about rivers.", seed=4)
    assert "".join(str(c.content) for c in chunks) == whole.content


def test_bind_tools_with_a_named_choice(llm: ChatOpenAI) -> None:
    bound = llm.bind_tools([get_weather, Add], tool_choice="get_weather")
    question = HumanMessage("Weather in Rome?")
    reply = bound.invoke([question], max_tokens=128)
    assert isinstance(reply, AIMessage) and not reply.invalid_tool_calls
    assert len(reply.tool_calls) == 1
    call = reply.tool_calls[0]
    assert call["name"] == "get_weather" and call["id"]
    assert set(call["args"]) == {"city", "unit"}
    assert len(call["args"]["city"]) <= 12 and call["args"]["unit"] in ("celsius", "fahrenheit")

    # the tool's answer goes back in the next turn, as an agent loop does
    result = get_weather.invoke(call["args"])
    follow = bound.bind(tool_choice="none").invoke(
        [question, reply, ToolMessage(result, tool_call_id=call["id"])], max_tokens=4
    )
    assert isinstance(follow, AIMessage) and not follow.tool_calls


def test_bind_tools_required_while_streaming(llm: ChatOpenAI) -> None:
    bound = llm.bind_tools([Add], tool_choice="any")  # LangChain's "any" is OpenAI's "required"
    merged: Any = None
    for chunk in bound.stream("What is 2 + 3?", max_tokens=64):
        merged = chunk if merged is None else merged + chunk
    assert merged is not None and len(merged.tool_calls) == 1
    call = merged.tool_calls[0]
    assert call["name"] == "Add"
    assert Add.model_validate(call["args"]).a == call["args"]["a"]
