"""Anthropic Messages against a real gateway and engine, through the official ``anthropic`` SDK.

The policy is untrained, so free text is noise; where a test needs a shape (a tool call, JSON, a
stop sequence) it asks for constrained decoding, which makes the output valid whatever the weights.
Prompt sizes are checked token for token against the policy tokenizer's own rendering.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from areal.run.gateway_client import GatewayAdmin, OpenedSession
from support.gateway import engine_paused
from support.http import sse_data

WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather forecast for a city.",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city", "days"],
        "additionalProperties": False,
    },
}
CLOCK: Any = {
    "name": "get_time",
    "description": "The local time in a zone.",
    "input_schema": {
        "type": "object",
        "properties": {"zone": {"type": "string", "maxLength": 8}},
        "required": ["zone"],
        "additionalProperties": False,
    },
    "cache_control": {"type": "ephemeral"},  # echoed client fields are ignored
}


def openai_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = {
        "name": tool["name"],
        "description": tool["description"],
        "parameters": tool["input_schema"],
    }
    return {"type": "function", "function": function}


def satisfies(schema: dict[str, Any], value: Any) -> bool:
    """The subset of JSON Schema the tools above use."""
    if "enum" in schema and value not in schema["enum"]:
        return False
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        if not isinstance(value, dict) or any(k not in value for k in schema.get("required", [])):
            return False
        if schema.get("additionalProperties") is False and set(value) - set(props):
            return False
        return all(satisfies(props[k], v) for k, v in value.items() if k in props)
    if kind == "integer":
        return isinstance(value, int) and schema.get("minimum", value) <= value <= schema.get(
            "maximum", value
        )
    if kind == "string":
        return isinstance(value, str) and len(value) <= schema.get("maxLength", len(value))
    return True


@pytest.fixture(scope="module")
def count(tokenizer: Any) -> Any:
    """Prompt tokens of an OpenAI-shaped chat, as the policy's own template renders it."""

    def prompt_tokens(
        messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, prefix: str = ""
    ) -> int:
        text = tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True
        )
        return len(tokenizer.encode(text + prefix, add_special_tokens=False))

    return prompt_tokens


@pytest.fixture(scope="module")
def client(gateway: Any) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(
        base_url=gateway.url, api_key=gateway.key, max_retries=0, timeout=60
    ) as c:
        yield c


# --- plain messages --------------------------------------------------------------------------


def test_create_counts_tokens_exactly(
    client: anthropic.Anthropic, gateway: Any, count: Any
) -> None:
    system = "You are terse."
    messages: list[Any] = [{"role": "user", "content": "Say hi."}]
    reply = client.messages.create(
        model=gateway.model, max_tokens=8, system=system, messages=messages
    )
    expected = count([{"role": "system", "content": system}, *messages])
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    assert reply.model == gateway.model
    assert [b.type for b in reply.content] == ["text"]
    assert reply.stop_reason in ("end_turn", "max_tokens")
    assert reply.usage.input_tokens == expected
    assert 1 <= reply.usage.output_tokens <= 8
    assert reply.usage.cache_read_input_tokens == 0
    tokens = client.messages.count_tokens(model=gateway.model, system=system, messages=messages)
    assert tokens.input_tokens == expected


def test_system_blocks_and_extra_fields_are_accepted(
    client: anthropic.Anthropic, gateway: Any, count: Any
) -> None:
    """What Claude Code sends: system blocks with cache_control, metadata, thinking, betas..."""
    reply = client.messages.create(
        model=gateway.model,
        max_tokens=64000,  # Claude Code asks for 32k+: clamped to the route's cap, not refused
        system=[
            {"type": "text", "text": "You are terse."},
            {"type": "text", "text": "Answer in English.", "cache_control": {"type": "ephemeral"}},
        ],
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Say hi.", "cache_control": {"type": "ephemeral"}}
                ],
            }
        ],
        metadata={"user_id": "user-42"},
        service_tier="auto",
        output_config={"effort": "high"},
        extra_headers={"anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14"},
        extra_body={
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "context_management": {"edits": []},
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 40,
            "prompt_cache_key": "abc",
        },
    )
    system = "You are terse.\nAnswer in English."
    expected = count(
        [{"role": "system", "content": system}, {"role": "user", "content": "Say hi."}]
    )
    assert reply.usage.input_tokens == expected
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens <= 256


def test_conversation_shapes(client: anthropic.Anthropic, gateway: Any, count: Any) -> None:
    """Consecutive same-role turns and a system turn mid-conversation render as they are."""
    messages: list[Any] = [
        {"role": "user", "content": "one"},
        {"role": "user", "content": [{"type": "text", "text": "two"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hm", "signature": "x"},  # dropped
                {"type": "text", "text": "three"},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "four"}]},
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "five"},
    ]
    tokens = client.messages.count_tokens(model="default", messages=messages)
    expected = [
        {"role": "user", "content": "one"},
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": "three"},
        {"role": "assistant", "content": "four"},
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "five"},
    ]
    assert tokens.input_tokens == count(expected)


def test_assistant_prefill_is_continued(
    client: anthropic.Anthropic, gateway: Any, count: Any
) -> None:
    reply = client.messages.create(
        model=gateway.model,
        max_tokens=4,
        messages=[
            {"role": "user", "content": "Say hi."},
            {"role": "assistant", "content": "Hi"},
        ],
    )
    assert reply.usage.input_tokens == count([{"role": "user", "content": "Say hi."}], prefix="Hi")


def test_async_client(gateway: Any, count: Any) -> None:
    async def run() -> tuple[Any, list[str]]:
        async with anthropic.AsyncAnthropic(
            base_url=gateway.url, api_key=gateway.key, max_retries=0
        ) as c:
            reply = await c.messages.create(
                model=gateway.model, max_tokens=6, messages=[{"role": "user", "content": "hi"}]
            )
            stream = await c.messages.create(
                model=gateway.model,
                max_tokens=6,
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
            )
            kinds: list[str] = [event.type async for event in stream]
            return reply, kinds

    reply, kinds = asyncio.run(run())
    assert reply.usage.input_tokens == count([{"role": "user", "content": "hi"}])
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]


# --- streaming -------------------------------------------------------------------------------


def test_stream_helper(client: anthropic.Anthropic, gateway: Any, count: Any) -> None:
    messages: list[Any] = [{"role": "user", "content": "Tell me a story."}]
    with client.messages.stream(model=gateway.model, max_tokens=24, messages=messages) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == "".join(texts)
    assert final.usage.input_tokens == count(messages)
    assert final.usage.output_tokens == 24 and final.stop_reason == "max_tokens"


def test_stream_event_sequence(gateway: Any) -> None:
    """Every ``data:`` line has its named ``event:`` line, in Anthropic's order, with usage."""
    body = {
        "model": gateway.model,
        "max_tokens": 12,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    events = []
    with httpx.stream(
        "POST",
        f"{gateway.v1}/messages?beta=true",
        json=body,
        headers={"x-api-key": gateway.key, "anthropic-version": "2023-06-01"},
        timeout=60,
    ) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in resp.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == name
                events.append(data)
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["message_start", "ping"]
    assert kinds[2] == "content_block_start" and kinds[-3:] == [
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert set(kinds[3:-3]) <= {"content_block_delta"}
    usage = events[0]["message"]["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] == 0
    delta = events[-2]
    assert delta["delta"]["stop_reason"] == "max_tokens"
    assert delta["usage"]["output_tokens"] == 12


# --- tools -----------------------------------------------------------------------------------


def test_forced_tool_call(client: anthropic.Anthropic, gateway: Any, count: Any) -> None:
    messages: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    reply = client.messages.create(
        model=gateway.model,
        max_tokens=256,
        tools=[WEATHER, CLOCK],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=messages,
    )
    assert reply.stop_reason == "tool_use"
    (block,) = reply.content
    assert block.type == "tool_use" and block.name == "get_weather"
    assert block.id.startswith("toolu_")
    assert satisfies(WEATHER["input_schema"], block.input)
    tools = [openai_tool(WEATHER), openai_tool(CLOCK)]
    assert reply.usage.input_tokens == count(messages, tools, prefix="<tool_call>\n")
    tokens = client.messages.count_tokens(
        model=gateway.model,
        tools=[WEATHER, CLOCK],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=messages,
    )
    assert tokens.input_tokens == reply.usage.input_tokens


def test_a_forced_call_is_the_openai_routes_call(client: anthropic.Anthropic, gateway: Any) -> None:
    """Both protocols force a call through one grammar (``{"name", "arguments"}`` and nothing else)
    and read it with the policy's registered tool parser: greedy decoding of the same chat writes
    the same call on both routes, token for token."""
    import openai

    messages: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    reply = client.messages.create(
        model=gateway.model,
        max_tokens=256,
        extra_body={"temperature": 0.0},  # the SDK version here has no temperature argument
        tools=[WEATHER, CLOCK],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=messages,
    )
    chat = openai.OpenAI(base_url=gateway.v1, api_key=gateway.key, max_retries=0)
    other = chat.chat.completions.create(
        model=gateway.model,
        max_tokens=256,
        temperature=0.0,
        tools=[openai_tool(WEATHER), openai_tool(CLOCK)],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        messages=messages,
    )
    (block,) = reply.content
    (call,) = other.choices[0].message.tool_calls or []
    assert block.type == "tool_use" and call.function.name == block.name == "get_weather"
    assert json.loads(call.function.arguments) == block.input
    assert reply.usage.output_tokens == (other.usage.completion_tokens if other.usage else -1)


def test_any_tool_then_tool_result(client: anthropic.Anthropic, gateway: Any, count: Any) -> None:
    """A call forced with ``any``, then the next turn with its result (the id comes back changed)."""
    tools: list[Any] = [WEATHER, CLOCK]
    first = client.messages.create(
        model=gateway.model,
        max_tokens=256,
        tools=tools,
        tool_choice={"type": "any"},
        messages=[{"role": "user", "content": "Weather or time?"}],
    )
    (call,) = first.content
    assert call.type == "tool_use" and call.name in ("get_weather", "get_time")
    schema = WEATHER if call.name == "get_weather" else CLOCK
    assert satisfies(schema["input_schema"], call.input)

    altered = "toolu_" + "0" * 24  # some clients rewrite ids; rendering must not care
    messages: list[Any] = [
        {"role": "user", "content": "Weather or time?"},
        {"role": "assistant", "content": [c.model_dump() for c in first.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": altered,
                    "content": [{"type": "text", "text": "sunny"}],
                },
                {"type": "text", "text": "thanks"},
            ],
        },
    ]
    second = client.messages.create(
        model=gateway.model, max_tokens=4, tools=tools, messages=messages
    )
    expected = [
        {"role": "user", "content": "Weather or time?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    # the gateway writes an input object's text as it is (an untrained
                    # policy's strings may hold any character), not \u-escaped
                    "function": {
                        "name": call.name,
                        "arguments": json.dumps(call.input, ensure_ascii=False),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": altered, "content": "sunny"},
        {"role": "user", "content": "thanks"},
    ]
    assert second.usage.input_tokens == count(expected, [openai_tool(WEATHER), openai_tool(CLOCK)])

    # tool_choice none: the tools leave the prompt and nothing is parsed as a call
    third = client.messages.create(
        model=gateway.model,
        max_tokens=4,
        tools=tools,
        tool_choice={"type": "none"},
        messages=messages,
    )
    assert third.usage.input_tokens == count(expected)
    assert [b.type for b in third.content] == ["text"]


def test_streamed_tool_call(client: anthropic.Anthropic, gateway: Any) -> None:
    partial: list[str] = []
    with client.messages.stream(
        model=gateway.model,
        max_tokens=256,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "Weather in Lima?"}],
    ) as stream:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                partial.append(event.delta.partial_json)
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    (block,) = final.content
    assert block.type == "tool_use" and block.name == "get_weather"
    assert len(partial) > 1  # the arguments stream as they are generated
    assert json.loads("".join(partial)) == block.input
    assert satisfies(WEATHER["input_schema"], block.input)


# --- one tool machinery for both protocols ----------------------------------------------------

FORCED_CHOICES: list[Any] = [  # (Anthropic's tool_choice, the same choice in Chat Completions)
    (
        {"type": "tool", "name": "get_weather"},
        {"type": "function", "function": {"name": "get_weather"}},
    ),
    ({"type": "any"}, "required"),
]


def _both_clients(gw: Any) -> tuple[anthropic.Anthropic, openai.OpenAI]:
    return (
        anthropic.Anthropic(base_url=gw.url, api_key=gw.key, max_retries=0, timeout=60),
        openai.OpenAI(base_url=gw.v1, api_key=gw.key, max_retries=0, timeout=60),
    )


@pytest.mark.parametrize(("claude_choice", "openai_choice"), FORCED_CHOICES)
def test_forced_call_has_the_openai_grammar_and_parse(
    recorded_gateway: Any, claude_choice: Any, openai_choice: Any
) -> None:
    """A forced call asks the engine for exactly what Chat Completions asks (the same prompt ids,
    the same grammar, which closes the call's object: additionalProperties false), and the
    generation is read by the same registered parser into the same call."""
    gw, recorder = recorded_gateway
    question: list[Any] = [{"role": "user", "content": "Weather in Tokyo?"}]
    claude, gpt = _both_clients(gw)
    with claude, gpt:
        start = len(recorder.generate_bodies)
        reply = claude.messages.create(
            model=gw.model,
            max_tokens=256,
            extra_body={"temperature": 0},  # (this SDK has no temperature argument)
            tools=[WEATHER, CLOCK],
            tool_choice=claude_choice,
            messages=question,
        )
        chat = gpt.chat.completions.create(
            model=gw.model,
            max_tokens=256,
            temperature=0,
            tools=[openai_tool(WEATHER), openai_tool(CLOCK)],
            tool_choice=openai_choice,
            messages=question,
        )
    sent_claude, sent_openai = recorder.generate_bodies[start:]
    assert sent_claude["input_ids"] == sent_openai["input_ids"]
    grammar = sent_claude["sampling_params"]["structural_tag"]
    assert grammar == sent_openai["sampling_params"]["structural_tag"]
    assert "json_schema" not in sent_claude["sampling_params"]
    # the call's JSON, then the parser's closing text: the call as the chat template writes it
    tag = json.loads(grammar)
    assert tag["type"] == "structural_tag" and tag["format"]["type"] == "sequence"
    call_json, closing = tag["format"]["elements"]
    assert closing == {"type": "const_string", "value": "\n</tool_call>"}
    assert call_json["type"] == "json_schema"
    schema = call_json["json_schema"]
    for call_schema in schema.get("anyOf", [schema]):  # an extra key beside name/arguments is
        assert call_schema["additionalProperties"] is False  # impossible under the grammar
        assert call_schema["required"] == ["name", "arguments"]

    (block,) = reply.content
    (call,) = chat.choices[0].message.tool_calls or []
    assert block.type == "tool_use" and call.type == "function"
    assert (block.name, block.input) == (call.function.name, json.loads(call.function.arguments))
    tool = WEATHER if block.name == "get_weather" else CLOCK
    assert satisfies(tool["input_schema"], block.input)
    assert block.id.startswith("toolu_") and call.id.startswith("call_")
    assert reply.stop_reason == "tool_use" and chat.choices[0].finish_reason == "tool_calls"


def test_streamed_forced_call_is_the_whole_one(recorded_gateway: Any) -> None:
    """Streamed, a forced call's arguments go out as they are written and add up to the call
    the parser reads from the same generation unstreamed (and in Chat Completions)."""
    gw, _ = recorded_gateway
    kwargs: dict[str, Any] = {
        "model": gw.model,
        "max_tokens": 256,
        "extra_body": {"temperature": 0},
        "tools": [WEATHER, CLOCK],
        "tool_choice": {"type": "any"},
        "messages": [{"role": "user", "content": "Weather in Lima?"}],
    }
    claude, gpt = _both_clients(gw)
    with claude, gpt:
        whole = claude.messages.create(**kwargs)
        partial: list[str] = []
        with claude.messages.stream(**kwargs) as stream:
            for event in stream:
                if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                    partial.append(event.delta.partial_json)
            streamed = stream.get_final_message()
        chat = gpt.chat.completions.create(
            model=gw.model,
            max_tokens=256,
            temperature=0,
            tools=[openai_tool(WEATHER), openai_tool(CLOCK)],
            tool_choice="required",
            messages=kwargs["messages"],
            stream=True,
        )
        calls = [c for chunk in chat for c in (chunk.choices[0].delta.tool_calls or [])]
    (block,) = streamed.content
    (expected,) = whole.content
    assert block.type == expected.type == "tool_use" and len(partial) > 1
    assert (block.name, block.input) == (expected.name, expected.input)
    assert json.loads("".join(partial)) == block.input
    (call,) = calls
    assert call.function is not None and call.function.arguments is not None
    assert (call.function.name, json.loads(call.function.arguments)) == (block.name, block.input)


# --- structured output and stop sequences ----------------------------------------------------


def test_output_config_json_schema(client: anthropic.Anthropic, gateway: Any) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    reply = client.messages.create(
        model=gateway.model,
        max_tokens=64,
        messages=[{"role": "user", "content": "Yes or no?"}],
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    assert reply.stop_reason == "end_turn"
    assert reply.content[0].type == "text"
    assert json.loads(reply.content[0].text)["answer"] in ("yes", "no")


def test_stop_sequences(client: anthropic.Anthropic, gateway: Any) -> None:
    """JSON fixed by a schema runs into the stop sequence at a known place, streamed or not."""
    kwargs: dict[str, Any] = {
        "model": gateway.model,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Greet."}],
        "stop_sequences": ["world"],
        "output_config": {
            "format": {
                "type": "json_schema",
                "schema": {
                    "type": "object",
                    "properties": {"greeting": {"const": "hello world"}},
                    "required": ["greeting"],
                },
            }
        },
    }
    reply = client.messages.create(**kwargs)
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == "world"
    text = reply.content[0].text
    assert text.endswith("hello ") and "world" not in text
    with client.messages.stream(**kwargs) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text  # nothing of the stop sequence leaked into a delta
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == "world"


# --- routes, hints, errors -------------------------------------------------------------------


def test_beta_route_and_prefixes(client: anthropic.Anthropic, gateway: Any) -> None:
    reply = client.beta.messages.create(  # the SDK's beta namespace adds ?beta=true
        model=gateway.model,
        max_tokens=4,
        messages=[{"role": "user", "content": "hi"}],
        betas=["claude-code-20250219", "some-future-beta-2099-01-01"],
    )
    assert reply.type == "message"
    for path in ("/gateway/v1/messages", "/messages", "/v1/messages/count_tokens?beta=true"):
        resp = httpx.post(
            gateway.url + path,
            json={
                "model": gateway.model,
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}],
            },
            headers={"Authorization": f"Bearer {gateway.key}"},
            timeout=60,
        )
        assert resp.status_code == 200, (path, resp.text)


def test_client_session_hints_group_the_log(gateway: Any) -> None:
    def send(headers: dict[str, str], metadata: dict[str, Any] | None = None) -> None:
        body: dict[str, Any] = {
            "model": gateway.model,
            "max_tokens": 2,
            "messages": [{"role": "user", "content": "hi"}],
        }
        if metadata is not None:
            body["metadata"] = metadata
        resp = httpx.post(
            f"{gateway.v1}/messages",
            json=body,
            headers={"x-api-key": gateway.key, **headers},
            timeout=60,
        )
        assert resp.status_code == 200, resp.text

    send({"x-claude-code-session-id": "cc-session-1"})
    send({}, {"user_id": json.dumps({"device_id": "d", "session_id": "cc-session-2"})})
    send({}, {"user_id": "user 3"})
    log = (gateway.log_dir / "gateway.log").read_text()
    for hint in ("session=cc-session-1 ", "session=cc-session-2 ", "session=user_3 "):
        assert hint in log


def test_errors_use_the_anthropic_schema(client: anthropic.Anthropic, gateway: Any) -> None:
    bad = anthropic.Anthropic(base_url=gateway.url, api_key="wrong-key", max_retries=0)
    with bad, pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(
            model=gateway.model, max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
    image: Any = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
    }
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(
            model=gateway.model,
            max_tokens=4,
            messages=[{"role": "user", "content": [{"type": "text", "text": "see"}, image]}],
        )
    assert err.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "messages.0.content.1: images are not supported by the policy",
        },
    }
    bad_requests: list[dict[str, Any]] = [
        {"tools": [{"name": "x", "input_schema": {"type": "string"}}]},
        {"tools": [{"name": "has space", "input_schema": {"type": "object"}}]},
        {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
        {"tool_choice": {"type": "any"}},
        {"tool_choice": {"type": "sometimes"}},
        {"messages": [{"role": "robot", "content": "hi"}]},
        {"messages": []},
        {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": 1}]}]},
        {"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
        {"messages": [{"role": "user", "content": 42}]},
        {"system": [{"type": "image"}]},
        {"stop_sequences": "world"},
        {"max_tokens": 0},
        {"temperature": "hot"},
        {"stream": "yes"},
        {"output_config": {"format": {"type": "json_schema", "schema": "{}"}}},
    ]
    for patch in bad_requests:
        body = {
            "model": gateway.model,
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}],
            **patch,
        }
        resp = httpx.post(
            f"{gateway.v1}/messages", json=body, headers={"x-api-key": gateway.key}, timeout=60
        )
        assert resp.status_code == 400, (patch, resp.text)
        error = resp.json()
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    missing = httpx.post(
        f"{gateway.v1}/messages",
        json={"model": gateway.model, "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": gateway.key},
        timeout=60,
    )
    assert missing.status_code == 400 and "max_tokens" in missing.json()["error"]["message"]


def test_unknown_model_is_not_found(client: anthropic.Anthropic, gateway: Any) -> None:
    with pytest.raises(anthropic.NotFoundError) as err:
        client.messages.create(
            model="claude-opus-4", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
    body: Any = err.value.body
    message = body["error"]["message"]
    assert "claude-opus-4" in message and gateway.model in message


def test_prompt_longer_than_the_context(client: anthropic.Anthropic, gateway: Any) -> None:
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(
            model=gateway.model,
            max_tokens=4,
            messages=[{"role": "user", "content": "word " * 5000}],
            stream=True,
        )
    assert "context is 4096 tokens" in err.value.message


# --- recording for RL ------------------------------------------------------------------------


def _open_session(gateway: Any, **fields: Any) -> OpenedSession:
    return asyncio.run(GatewayAdmin(gateway.url, gateway.admin).open_session(**fields))


def test_session_key_records_token_for_token(gateway: Any, tokenizer: Any) -> None:
    """Calls made with a session key are recorded exactly as generated; the message id of a
    non-streamed reply is the completion's handle for a reward."""
    s = _open_session(gateway)
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    with anthropic.Anthropic(base_url=gateway.url, api_key=s["api_key"], max_retries=0) as c:
        reply = c.messages.create(model=gateway.model, max_tokens=5, messages=messages)
        # long enough to cut multi-byte characters between chunks, which must not garble text
        with c.messages.stream(model=gateway.model, max_tokens=48, messages=messages) as stream:
            streamed = "".join(stream.text_stream)
            final = stream.get_final_message()
    session = gateway.state.sessions.get(s["session_id"])
    first, second = session.completions
    assert reply.id == first.completion_id
    assert len(first.prompt_ids) == reply.usage.input_tokens
    assert len(first.output_ids) == reply.usage.output_tokens == len(first.output_logprobs)
    assert len(second.output_ids) == final.usage.output_tokens == 48
    assert tokenizer.decode(second.output_ids, skip_special_tokens=True) == streamed
    reward = httpx.post(
        f"{gateway.url}/rl/sessions/{s['session_id']}/reward",
        json={"completion_id": reply.id, "reward": 1.0},
        headers=gateway.headers(s["api_key"]),
    )
    assert reward.status_code == 200, reward.text


def test_streamed_text_is_the_recorded_tokens(gateway: Any, tokenizer: Any) -> None:
    """What a stream says is exactly the recorded output, even where a multi-byte character is
    split between chunks (free strings under a schema produce many such splits)."""
    s = _open_session(gateway)
    schema = {"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]}
    with anthropic.Anthropic(base_url=gateway.url, api_key=s["api_key"], max_retries=0) as c:
        for turn in range(4):
            with c.messages.stream(
                model=gateway.model,
                max_tokens=64,
                messages=[{"role": "user", "content": "note"}],
                output_config={"format": {"type": "json_schema", "schema": schema}},
            ) as stream:
                streamed = "".join(stream.text_stream)
            recorded = gateway.state.sessions.get(s["session_id"]).completions[turn]
            assert streamed == tokenizer.decode(recorded.output_ids, skip_special_tokens=True)


def test_session_bound_to_a_client_hint(gateway: Any) -> None:
    """A driver may bind a session to Claude Code's own session id; calls with the plain key that
    carry it are recorded there."""
    s = _open_session(gateway, hint="cc-bound-episode")
    resp = httpx.post(
        f"{gateway.v1}/messages",
        json={
            "model": gateway.model,
            "max_tokens": 3,
            "messages": [{"role": "user", "content": "hi"}],
        },
        headers={"x-api-key": gateway.key, "x-claude-code-session-id": "cc-bound-episode"},
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    session = gateway.state.sessions.get(s["session_id"])
    assert [c.completion_id for c in session.completions] == [resp.json()["id"]]
    log = (gateway.log_dir / "gateway.log").read_text()
    assert f"session={s['session_id']} " in log


def test_stream_is_real(gateway: Any, tokenizer: Any) -> None:
    """Deltas leave while the engine is still generating: when the first one is in, the engine
    (held paused for the look) still runs the call and has not made all its tokens.
    (A fixed-length string under a schema keeps the policy from stopping early.)"""
    s = _open_session(gateway)
    schema = {
        "type": "object",
        "properties": {"s": {"type": "string", "minLength": 200, "maxLength": 200}},
        "required": ["s"],
    }
    body = {
        "model": gateway.model,
        "max_tokens": 256,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
        "output_config": {"format": {"type": "json_schema", "schema": schema}},
    }
    before = gateway.engine_stats()["tokens_generated"]
    deltas = 0
    at_first: dict[str, Any] = {}
    text = ""
    with httpx.stream(
        "POST", f"{gateway.v1}/messages", json=body, headers={"x-api-key": s["api_key"]}, timeout=60
    ) as resp:
        for data in sse_data(resp):
            if '"text_delta"' in data:
                deltas += 1
                text += json.loads(data)["delta"]["text"]
                if deltas == 1:
                    with engine_paused(gateway.engine_url):
                        at_first = gateway.engine_stats()
    assert deltas > 20
    assert at_first["running"] == 1, at_first  # the call was still generating ...
    made = len(gateway.state.sessions.get(s["session_id"]).completions[0].output_ids)
    assert at_first["tokens_generated"] - before < made, at_first  # ... with tokens to go
    # multi-byte characters split between chunks come out whole, never twice: the text is the
    # recorded tokens'. (Not "200 characters": the grammar counts an escape such as \\ as two.)
    recorded = gateway.state.sessions.get(s["session_id"]).completions[0]
    assert text == tokenizer.decode(recorded.output_ids, skip_special_tokens=True)
    assert isinstance(json.loads(text)["s"], str)
