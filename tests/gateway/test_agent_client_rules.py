"""The rules agent frameworks rely on, the same on every protocol and in both stream modes:

- a forced tool call the token limit cuts is still a tool call, its arguments as far as they were
  written, with the protocol's truncation finish (``length`` / ``incomplete`` / ``max_tokens``);
- hosted tools the policy cannot call (web search, namespaces, ...) are left out of the prompt,
  named in ``gateway.log`` and counted, and the request is served;
- ``json_object`` output is a JSON object, never an array or a scalar;
- a forced call and the turn that sends it back with its result are one training sample: the
  engine writes the call exactly as the chat template renders it.

Each is checked through the official ``openai`` and ``anthropic`` SDKs against the real gateway and
embedded engine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from areal.gateway.chat_messages import partial_arguments
from support.gateway import trajectories

NOTE: Any = {
    "name": "take_note",
    "description": "Write a note down.",
    "input_schema": {
        "type": "object",
        "properties": {"note": {"type": "string"}, "pages": {"type": "integer"}},
        "required": ["note", "pages"],
    },
}
NAP: Any = {
    "name": "take_nap",
    "description": "Sleep for some minutes.",
    "input_schema": {
        "type": "object",
        "properties": {"minutes": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["minutes"],
    },
}
QUESTION = "Remember that the meeting moved to Thursday, in the blue room."


def chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    fn = {"name": tool["name"], "description": tool["description"]}
    return {"type": "function", "function": {**fn, "parameters": tool["input_schema"]}}


def responses_tool(tool: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", **chat_tool(tool)["function"]}


@pytest.fixture(scope="module")
def clients(gateway: Any) -> Iterator[tuple[openai.OpenAI, anthropic.Anthropic]]:
    gpt = openai.OpenAI(base_url=gateway.v1, api_key=gateway.key, max_retries=0, timeout=60)
    claude = anthropic.Anthropic(base_url=gateway.url, api_key=gateway.key, max_retries=0)
    with gpt, claude:
        yield gpt, claude


# --- a forced call cut by the limit ----------------------------------------------------------


def chat_call(
    gpt: openai.OpenAI, limit: int, stream: bool, choice: Any = "required"
) -> tuple[str, str, str]:
    """(name, arguments, finish) of a forced Chat Completions call."""
    body: Any = dict(
        model="areal-tiny",
        messages=[{"role": "user", "content": QUESTION}],
        tools=[chat_tool(NOTE), chat_tool(NAP)],
        tool_choice=choice,
        max_tokens=limit,
        temperature=0,
    )
    if not stream:
        choice = gpt.chat.completions.create(**body).choices[0]
        assert choice.message.content is None
        (call,) = choice.message.tool_calls or []
        assert call.type == "function"
        return call.function.name, call.function.arguments, choice.finish_reason
    name, arguments, finish, ids = "", "", "", set()
    for chunk in gpt.chat.completions.create(**body, stream=True):
        for choice in chunk.choices:
            assert choice.delta.content is None, choice.delta  # no empty text part, even first
            for delta in choice.delta.tool_calls or []:
                assert delta.index == 0 and delta.function is not None
                ids.add(delta.id)
                name += delta.function.name or ""
                arguments += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    assert len(ids - {None}) == 1
    return name, arguments, finish


def responses_call(gpt: openai.OpenAI, limit: int, stream: bool) -> tuple[str, str, str]:
    """(name, arguments, status) of a forced Responses call; the item is ``incomplete`` too."""
    body: Any = dict(
        model="areal-tiny",
        input=QUESTION,
        tools=[responses_tool(NOTE), responses_tool(NAP)],
        tool_choice="required",
        max_output_tokens=limit,
        temperature=0,
    )
    if stream:
        events = list(gpt.responses.create(**body, stream=True))
        assert events[-1].type == "response.incomplete"
        response = events[-1].response
        added = [e.item for e in events if e.type == "response.output_item.added"]
        assert [item.type for item in added] == ["function_call"]
    else:
        response = gpt.responses.create(**body)
    (item,) = response.output
    assert item.type == "function_call" and item.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    return item.name, item.arguments, response.status


def anthropic_call(
    claude: anthropic.Anthropic, limit: int, stream: bool, choice: Any = None
) -> tuple[str, str, str]:
    """(name, arguments as written, stop_reason) of a forced Messages call. Streamed, the
    arguments are the ``input_json_delta`` pieces; whole, the block's ``input`` must be those
    pieces parsed as far as they go, so only the name and input can be compared."""
    body: Any = dict(
        model="areal-tiny",
        max_tokens=limit,
        tools=[NOTE, NAP],
        tool_choice=choice or {"type": "any"},
        messages=[{"role": "user", "content": QUESTION}],
        extra_body={"temperature": 0},
    )
    if not stream:
        reply = claude.messages.create(**body)
        (block,) = reply.content
        assert block.type == "tool_use" and block.id.startswith("toolu_")
        return block.name, json.dumps(block.input), str(reply.stop_reason)
    name, arguments, reason, kinds = "", "", "", []
    with claude.messages.stream(**body) as events:
        for event in events:
            if event.type == "content_block_start":
                kinds.append(event.content_block.type)
                name = getattr(event.content_block, "name", "")
            elif event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                arguments += event.delta.partial_json
            elif event.type == "message_delta":
                reason = str(event.delta.stop_reason)
    assert kinds == ["tool_use"]
    return name, arguments, reason


# 2 tokens: cut inside the name; 6: before the arguments; 14 and 40: inside them.
@pytest.mark.parametrize("limit", [2, 6, 14, 40])
def test_a_cut_forced_call_is_a_call_on_every_protocol_streamed_or_not(
    clients: tuple[openai.OpenAI, anthropic.Anthropic], limit: int
) -> None:
    gpt, claude = clients
    chat = chat_call(gpt, limit, stream=False)
    name, arguments, finish = chat
    assert finish == "length" and name in ("take_note", "take_nap")
    assert "<tool_call>" not in arguments and "}" not in arguments[-1:]
    assert chat_call(gpt, limit, stream=True) == chat
    assert responses_call(gpt, limit, stream=False) == (name, arguments, "incomplete")
    assert responses_call(gpt, limit, stream=True) == (name, arguments, "incomplete")
    assert anthropic_call(claude, limit, stream=True) == (name, arguments, "max_tokens")
    whole = anthropic_call(claude, limit, stream=False)
    assert whole == (name, json.dumps(partial_arguments(arguments)), "max_tokens")


def test_a_forced_call_that_closes_in_time_is_whole(
    clients: tuple[openai.OpenAI, anthropic.Anthropic],
) -> None:
    gpt, _ = clients
    choice = gpt.chat.completions.create(
        model="areal-tiny",
        messages=[{"role": "user", "content": QUESTION}],
        tools=[chat_tool(NAP)],
        tool_choice={"type": "function", "function": {"name": "take_nap"}},
        max_tokens=64,
        temperature=0,
    ).choices[0]
    (call,) = choice.message.tool_calls or []
    assert choice.finish_reason == "tool_calls"
    assert set(json.loads(call.function.arguments)) == {"minutes"}


def test_allowed_tools_force_a_call_among_some_of_the_tools(
    clients: tuple[openai.OpenAI, anthropic.Anthropic],
) -> None:
    """Chat Completions' ``allowed_tools`` (pydantic-ai sends it) as Responses' flat form: every
    tool in the prompt, the call forced among the listed ones; a bad mode is a 400."""
    gpt, _ = clients
    pick = {"type": "function", "function": {"name": "take_nap"}}
    for seed in range(3):
        choice = gpt.chat.completions.create(
            model="areal-tiny",
            messages=[{"role": "user", "content": QUESTION}],
            tools=[chat_tool(NOTE), chat_tool(NAP)],
            tool_choice={
                "type": "allowed_tools",
                "allowed_tools": {"mode": "required", "tools": [pick]},
            },  # type: ignore[typeddict-item]
            max_tokens=64,
            seed=seed,
        ).choices[0]
        (call,) = choice.message.tool_calls or []
        assert call.function.name == "take_nap" and choice.finish_reason == "tool_calls"
    with pytest.raises(openai.BadRequestError) as caught:
        gpt.chat.completions.create(
            model="areal-tiny",
            messages=[{"role": "user", "content": QUESTION}],
            tools=[chat_tool(NAP)],
            tool_choice={"type": "allowed_tools", "allowed_tools": {"mode": "x", "tools": [pick]}},  # type: ignore[typeddict-item]
        )
    assert caught.value.body["param"] == "tool_choice.allowed_tools.mode"  # type: ignore[index]


# --- hosted tools ----------------------------------------------------------------------------

HOSTED_RESPONSES = [
    {"type": "web_search"},
    {"type": "namespace", "name": "mcp__docs", "description": "Docs tools.", "tools": []},
    {"type": "file_search", "vector_store_ids": ["vs_1"]},
]
HOSTED_CHAT = [{"type": "custom", "custom": {"name": "apply_patch"}}]
HOSTED_ANTHROPIC = [
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 2},
    {"type": "bash_20250124", "name": "bash"},
]


def log_lines(gateway: Any, path: str) -> list[str]:
    text = (gateway.log_dir / "gateway.log").read_text()
    return [line for line in text.splitlines() if line.endswith(f"path={path}")]


def test_hosted_tools_are_left_out_named_and_counted(
    gateway: Any, clients: tuple[openai.OpenAI, anthropic.Anthropic]
) -> None:
    gpt, claude = clients
    before = httpx.get(f"{gateway.url}/rl/sessions", headers=gateway.headers(gateway.admin))
    counted = before.json()["dropped_tools"]

    def responses(tools: list[Any]) -> Any:
        return gpt.responses.create(
            model="areal-tiny", input=QUESTION, tools=tools, max_output_tokens=2
        )

    with_hosted = responses([*HOSTED_RESPONSES, responses_tool(NOTE)])
    alone = responses([responses_tool(NOTE)])
    assert with_hosted.usage is not None and alone.usage is not None
    assert with_hosted.usage.input_tokens == alone.usage.input_tokens  # the same prompt
    assert [t.type for t in with_hosted.tools] == ["function"]

    def chat(tools: list[Any]) -> Any:
        return gpt.chat.completions.create(
            model="areal-tiny",
            messages=[{"role": "user", "content": QUESTION}],
            tools=tools,
            max_tokens=2,
        )

    assert chat([*HOSTED_CHAT, chat_tool(NOTE)]).usage == chat([chat_tool(NOTE)]).usage

    def messages(tools: list[Any]) -> Any:
        return claude.messages.create(
            model="areal-tiny",
            max_tokens=2,
            tools=tools,
            messages=[{"role": "user", "content": QUESTION}],
        )

    usage = messages([*HOSTED_ANTHROPIC, NOTE]).usage
    assert usage.input_tokens == messages([NOTE]).usage.input_tokens

    dropped = [
        line.split(" dropped_tools=")[1].split()[0]
        for path in ("/v1/responses", "/v1/chat/completions", "/v1/messages")
        for line in log_lines(gateway, path)
        if " dropped_tools=" in line
    ]
    assert "web_search,namespace,file_search" in dropped
    assert "custom" in dropped and "web_search_20250305,bash_20250124" in dropped
    after = httpx.get(f"{gateway.url}/rl/sessions", headers=gateway.headers(gateway.admin))
    grown = {k: v - counted.get(k, 0) for k, v in after.json()["dropped_tools"].items()}
    assert grown == {
        "web_search": 1,
        "namespace": 1,
        "file_search": 1,
        "custom": 1,
        "web_search_20250305": 1,
        "bash_20250124": 1,
    }


def test_a_tool_type_that_is_no_tool_name_is_still_a_400(
    clients: tuple[openai.OpenAI, anthropic.Anthropic],
) -> None:
    gpt, _ = clients
    with pytest.raises(openai.BadRequestError) as caught:
        gpt.responses.create(model="areal-tiny", input="hi", tools=[{"type": "Web Search!"}])
    assert caught.value.body["param"] == "tools[0].type"  # type: ignore[index]
    assert "unknown tool type 'Web Search!'" in caught.value.message


# --- json_object -----------------------------------------------------------------------------


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(seed=st.integers(0, 2**31 - 1), responses=st.booleans())
def test_json_object_is_always_an_object(
    clients: tuple[openai.OpenAI, anthropic.Anthropic], seed: int, responses: bool
) -> None:
    """Sampled at T=1 from an untrained policy, whatever it writes is an object: whole when it
    stopped, the start of one when the limit cut it."""
    gpt, _ = clients
    if responses:
        reply = gpt.responses.create(
            model="areal-tiny",
            input="Describe a cat as JSON.",
            text={"format": {"type": "json_object"}},
            max_output_tokens=48,
            temperature=1.0,
            extra_body={"seed": seed},
        )
        text, stopped = reply.output_text, reply.status == "completed"
    else:
        choice = gpt.chat.completions.create(
            model="areal-tiny",
            messages=[{"role": "user", "content": "Describe a cat as JSON."}],
            response_format={"type": "json_object"},
            max_tokens=48,
            temperature=1.0,
            seed=seed,
        ).choices[0]
        text, stopped = choice.message.content or "", choice.finish_reason == "stop"
    if stopped:
        assert isinstance(json.loads(text), dict), text
    else:
        assert text.lstrip().startswith("{"), text


# --- a forced call and the turn after it: one sample ------------------------------------------

NAP_CALL = {"name": "take_nap"}
RESULT = "slept well"


def chat_round_trip(client: openai.OpenAI, stream: bool) -> str:
    """A forced Chat Completions call, then the turn that sends it back with its result; the
    call's text (its name and arguments) as the agent got it."""
    question: list[Any] = [{"role": "user", "content": QUESTION}]
    tools = [chat_tool(NOTE), chat_tool(NAP)]
    choice = {"type": "function", "function": NAP_CALL}
    body: Any = dict(model="areal-tiny", messages=question, tools=tools, tool_choice=choice)
    if stream:
        name, arguments, call_id = "", "", ""
        for chunk in client.chat.completions.create(**body, stream=True):
            for delta in (d for c in chunk.choices for d in c.delta.tool_calls or []):
                call_id += delta.id or ""
                name += (delta.function.name or "") if delta.function else ""
                arguments += (delta.function.arguments or "") if delta.function else ""
    else:
        (call,) = client.chat.completions.create(**body).choices[0].message.tool_calls or []
        assert call.type == "function"
        name, arguments, call_id = call.function.name, call.function.arguments, call.id
    sent = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    client.chat.completions.create(
        model="areal-tiny",
        messages=[
            *question,
            {"role": "assistant", "content": None, "tool_calls": [sent]},
            {"role": "tool", "tool_call_id": call_id, "content": RESULT},
        ],
        tools=tools,
        max_tokens=4,
    )
    return f"{name} {arguments}"


def responses_round_trip(client: openai.OpenAI, stream: bool) -> str:
    tools = [responses_tool(NOTE), responses_tool(NAP)]
    body: Any = dict(
        model="areal-tiny",
        input=[{"role": "user", "content": QUESTION}],
        tools=tools,
        tool_choice={"type": "function", **NAP_CALL},
    )
    if stream:
        with client.responses.stream(**body) as events:
            for _ in events:
                pass
            first = events.get_final_response()
    else:
        first = client.responses.create(**body)
    (call,) = first.output
    assert call.type == "function_call"
    result = {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}
    client.responses.create(
        model="areal-tiny",
        input=[*body["input"], *first.output, result],
        tools=tools,
        max_output_tokens=4,
    )
    return f"{call.name} {call.arguments}"


def anthropic_round_trip(client: anthropic.Anthropic, stream: bool) -> str:
    question: list[Any] = [{"role": "user", "content": QUESTION}]
    body: Any = dict(
        model="areal-tiny",
        max_tokens=64,
        tools=[NOTE, NAP],
        tool_choice={"type": "tool", **NAP_CALL},
        messages=question,
    )
    if stream:
        with client.messages.stream(**body) as events:
            reply = events.get_final_message()
    else:
        reply = client.messages.create(**body)
    (block,) = reply.content
    assert block.type == "tool_use"
    use = {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    result = {"type": "tool_result", "tool_use_id": block.id, "content": RESULT}
    history = [
        *question,
        {"role": "assistant", "content": [use]},
        {"role": "user", "content": [result]},
    ]
    client.messages.create(
        **{**body, "max_tokens": 4, "tool_choice": {"type": "auto"}, "messages": history}
    )
    return f"{block.name} {json.dumps(block.input)}"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", ["chat", "responses", "anthropic"])
def test_a_forced_call_and_the_turn_after_it_are_one_sample(
    gateway: Any, tokenizer: Any, api: str, stream: bool
) -> None:
    """The engine writes a forced call exactly as the chat template renders it when the agent
    sends it back (the call's JSON, then ``\\n</tool_call>``, then the stop token), so the next
    turn's prompt extends the first turn token for token and the episode trains as one sample."""
    opened = gateway.open_session()
    key = opened["api_key"]
    if api == "anthropic":
        with anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0) as claude:
            said = anthropic_round_trip(claude, stream)
    else:
        with openai.OpenAI(base_url=gateway.v1, api_key=key, max_retries=0, timeout=60) as gpt:
            said = (chat_round_trip if api == "chat" else responses_round_trip)(gpt, stream)
    end = httpx.post(
        f"{gateway.url}/rl/sessions/{opened['session_id']}/end", headers=gateway.headers(key)
    )
    assert end.status_code == 200, end.text
    assert (end.json()["completions"], end.json()["samples"]) == (2, 1)

    (trajectory,) = [
        t for t in trajectories(gateway.log_dir) if t.session_id == opened["session_id"]
    ]
    call, answer = trajectory.turns
    (sample,) = trajectory.samples
    first = call.prompt_ids + call.output_ids
    assert answer.prompt_ids[: len(first)] == first
    assert sample.input_ids.tolist() == answer.prompt_ids + answer.output_ids
    context = len(answer.prompt_ids) - len(first)
    assert sample.loss_mask.tolist() == (
        [0] * len(call.prompt_ids) + [1] * len(call.output_ids) + [0] * context
        + [1] * len(answer.output_ids)
    )  # fmt: skip
    # the call as generated: its JSON (what the agent was told), closed, then the stop token
    written = tokenizer.decode(call.output_ids)
    assert written.endswith("}\n</tool_call><|im_end|>"), written
    call_json = json.loads(written.removesuffix("\n</tool_call><|im_end|>"))
    assert call_json["name"] == "take_nap"
    assert said == f"take_nap {json.dumps(call_json['arguments'])}"


def test_a_forced_call_cut_in_its_closing_text_is_whole(
    clients: tuple[openai.OpenAI, anthropic.Anthropic], gateway: Any, tokenizer: Any
) -> None:
    """The limit may fall after the call's JSON, inside the closing ``\\n</tool_call>``: the
    arguments were all written, so every protocol says the call whole (the closing text is no
    part of them), as when the limit falls just before the stop token."""
    gpt, claude = clients
    chat_nap = {"type": "function", "function": NAP_CALL}
    opened = gateway.open_session()
    with openai.OpenAI(base_url=gateway.v1, api_key=opened["api_key"], max_retries=0) as mine:
        whole = chat_call(mine, 64, stream=False, choice=chat_nap)
    name, arguments, finish = whole
    assert finish == "tool_calls"
    (recorded,) = gateway.state.sessions.get(opened["session_id"]).completions
    ids = recorded.output_ids
    call_json = tokenizer.decode(ids, skip_special_tokens=True).removesuffix("\n</tool_call>")
    # the fewest tokens that hold the whole JSON, and at least its first character of closing
    limit = next(k for k in range(len(ids)) if len(tokenizer.decode(ids[:k])) > len(call_json))
    assert limit < len(ids) - 1  # the closing text is cut: neither it nor the stop token is whole
    cut = chat_call(gpt, limit, stream=False, choice=chat_nap)
    assert cut == chat_call(gpt, limit, True, chat_nap) == (name, arguments, "tool_calls")
    for stream in (False, True):
        body: Any = dict(
            model="areal-tiny",
            input=QUESTION,
            tools=[responses_tool(NOTE), responses_tool(NAP)],
            tool_choice={"type": "function", **NAP_CALL},
            max_output_tokens=limit,
            temperature=0,
            stream=stream,
        )
        reply = gpt.responses.create(**body)
        response = list(reply)[-1].response if stream else reply
        (item,) = response.output
        assert (item.name, item.arguments, item.status) == (name, arguments, "completed")
        assert response.status == "incomplete"
        anthropic_nap = {"type": "tool", **NAP_CALL}
        assert anthropic_call(claude, limit, stream, anthropic_nap) == (
            name,
            arguments,
            "max_tokens",
        )
