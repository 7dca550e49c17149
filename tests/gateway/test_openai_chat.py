"""Chat Completions through the official openai SDK against a real gateway + real engine.

The policy is untrained (random weights), so its free text is gibberish: tests compare token for
token with the engine, and check structure (tool calls, JSON) where constrained decoding makes
the output valid.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from areal.core.stop_strings import partial_stop
from areal.gateway.chat_messages import StreamText, normalize_messages
from areal.gateway.policy import Generation
from areal.plugins.inference.sglang_client import InferenceClient
from areal.run.gateway_client import GatewayAdmin, OpenedSession
from support import eventually
from support.gateway import engine_paused
from support.http import sse_data

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
            "required": ["zone"],
        },
    },
}
CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say something about the sea."},
]


@pytest.fixture(scope="module")
def client(gateway: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.v1, api_key=gateway.key, max_retries=0)


def prompt_len(tokenizer: Any, messages: list[dict[str, Any]], tools: Any = None) -> int:
    """The tokenizer's own count of the rendered prompt, independent of the gateway."""
    text = tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )
    return len(tokenizer.encode(text, add_special_tokens=False))


def engine_generate(gateway: Any, prompt_ids: list[int], params: dict[str, Any]) -> Any:
    async def run() -> Any:
        engine = InferenceClient(gateway.state.policy.engine_urls[0])
        try:
            return await engine.generate(input_ids=prompt_ids, sampling_params=params)
        finally:
            await engine.aclose()

    return asyncio.run(run())


def satisfies_weather(args: dict[str, Any]) -> bool:
    return (
        set(args) == {"city", "unit"}
        and isinstance(args["city"], str)
        and len(args["city"]) <= 12
        and args["unit"] in ("celsius", "fahrenheit")
    )


# --- plain replies --------------------------------------------------------------------------


def test_reply_is_token_exact_with_the_engine(client: openai.OpenAI, gateway: Any) -> None:
    reply = client.chat.completions.create(
        model=gateway.model, messages=CHAT, max_tokens=24, temperature=1.0, seed=11, logprobs=True
    )
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")

    prompt_ids = gateway.state.policy.render(CHAT)
    direct = engine_generate(
        gateway, prompt_ids, {"max_new_tokens": 24, "temperature": 1.0, "sampling_seed": 11}
    )
    assert choice.message.content == direct.text
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(prompt_ids)
    assert reply.usage.completion_tokens == len(direct.output_ids)
    assert reply.usage.total_tokens == len(prompt_ids) + len(direct.output_ids)
    # logprobs=true returns the behaviour log-probs of the sampled tokens
    assert choice.logprobs is not None and choice.logprobs.content is not None
    got = [t.logprob for t in choice.logprobs.content]
    assert got == pytest.approx(direct.output_logprobs, abs=1e-5)
    # streamed, the same log-probs arrive with the chunks
    chunks = client.chat.completions.create(
        model=gateway.model,
        messages=CHAT,
        max_tokens=24,
        temperature=1.0,
        seed=11,
        logprobs=True,
        stream=True,
    )
    streamed = [
        t.logprob
        for c in chunks
        for ch in c.choices
        for t in (ch.logprobs.content or [] if ch.logprobs else [])
    ]
    assert streamed == pytest.approx(direct.output_logprobs, abs=1e-5)


def test_a_gateway_behind_its_engine_sends_what_arrived_together_as_one_chunk(
    client: openai.OpenAI, gateway: Any
) -> None:
    """The engine streams a token a step. When the gateway's loop falls behind (held here until
    the engine has made 20 more tokens, as a busy gateway would be), the tokens that piled up
    leave as one chunk: its delta holds their text and its log-probs one entry per token,
    exactly as the engine made them."""
    params = {"max_tokens": 160, "temperature": 1.0, "seed": 5, "logprobs": True}
    stream = client.chat.completions.create(
        model=gateway.model, messages=CHAT, stream=True, extra_body={"ignore_eos": True}, **params
    )
    chunks = []
    held = threading.Event()
    for chunk in stream:
        chunks.append(chunk)
        if len(chunks) == 2:  # the first token is out; the engine goes on generating
            made = gateway.engine_stats()["tokens_generated"]
            gateway.http.loop.call_soon_threadsafe(held.wait, 60)  # the gateway's loop stops
            eventually(
                lambda made=made: gateway.engine_stats()["tokens_generated"] >= made + 20,
                60,
                "20 more tokens from the engine while the gateway's loop is held",
            )
            held.set()
    prompt_ids = gateway.state.policy.render(CHAT)
    direct = engine_generate(
        gateway,
        prompt_ids,
        {"max_new_tokens": 160, "temperature": 1.0, "sampling_seed": 5, "ignore_eos": True},
    )
    entries = [c.choices[0].logprobs.content or [] for c in chunks if c.choices[0].logprobs]
    # read token by token, a chunk holds at most the few tokens of held-back text
    assert max(map(len, entries)) >= 10 and len(entries) < len(direct.output_ids) - 9
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == direct.text
    streamed = [t.logprob for tokens in entries for t in tokens]
    assert streamed == pytest.approx(direct.output_logprobs, abs=1e-5)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_usage_counts_the_rendered_prompt(
    client: openai.OpenAI, gateway: Any, tokenizer: Any
) -> None:
    reply = client.chat.completions.create(
        model="default", messages=CHAT, max_completion_tokens=4, tools=[WEATHER]
    )
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == prompt_len(tokenizer, CHAT, [WEATHER])
    assert 0 < reply.usage.completion_tokens <= 4
    assert reply.model == gateway.model


def test_quirky_messages_are_accepted(client: openai.OpenAI, tokenizer: Any) -> None:
    messages: list[Any] = [
        {"role": "developer", "content": "Be brief.", "name": "ops"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "one "}, {"type": "text", "text": "two"}],
        },
        {"role": "user", "content": "three", "name": "bob", "x_unknown": 1},
        {"role": "system", "content": "Mid-conversation rule."},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "four"},
    ]
    reply = client.chat.completions.create(
        model="default",
        messages=messages,
        max_tokens=2,
        extra_body={
            "store": True,
            "metadata": {"k": "v"},
            "prompt_cache_key": "conv-1",
            "parallel_tool_calls": False,
            "user": "u1",
        },
    )
    expected = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "one two"},
        {"role": "user", "content": "three"},
        {"role": "system", "content": "Mid-conversation rule."},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "four"},
    ]
    assert normalize_messages(messages) == expected
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == prompt_len(tokenizer, expected)


def test_stop_strings_end_the_reply_stream_and_not(client: openai.OpenAI, gateway: Any) -> None:
    free = client.chat.completions.create(
        model=gateway.model, messages=CHAT, max_tokens=40, seed=5, extra_body={"ignore_eos": True}
    )
    text = free.choices[0].message.content or ""
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert len(stop) == 3
    expected = text[: text.index(stop)]
    request: dict[str, Any] = {
        "model": gateway.model,
        "messages": CHAT,
        "max_tokens": 40,
        "seed": 5,
        "stop": [stop, "\u0000never"],
        "extra_body": {"ignore_eos": True},
    }
    stopped = client.chat.completions.create(**request)
    assert stopped.choices[0].message.content == expected
    assert stopped.choices[0].finish_reason == "stop"
    # streamed, the first part of the stop string must never reach the client
    chunks = list(client.chat.completions.create(stream=True, **request))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected


def test_max_tokens_is_clamped_not_refused(client: openai.OpenAI, gateway: Any) -> None:
    reply = client.chat.completions.create(
        model=gateway.model,
        messages=CHAT,
        max_tokens=100_000,
        extra_body={"ignore_eos": True},
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 256  # the route's cap


def test_n_choices(client: openai.OpenAI, gateway: Any) -> None:
    one = client.chat.completions.create(model=gateway.model, messages=CHAT, max_tokens=12, seed=9)
    three = client.chat.completions.create(
        model=gateway.model, messages=CHAT, max_tokens=12, seed=9, n=3
    )
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert three.choices[0].message.content == one.choices[0].message.content
    assert len({c.message.content for c in three.choices}) > 1  # each choice has its own seed
    assert three.usage is not None and one.usage is not None
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    streamed = list(
        client.chat.completions.create(
            model=gateway.model, messages=CHAT, max_tokens=12, seed=9, n=3, stream=True
        )
    )
    texts = {i: "" for i in range(3)}
    finished = set()
    for chunk in streamed:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1, 2}
    assert [texts[i] for i in range(3)] == [c.message.content for c in three.choices]


# --- streaming ------------------------------------------------------------------------------


def test_async_stream_matches_the_plain_reply(gateway: Any) -> None:
    async def run() -> tuple[Any, list[Any]]:
        client = openai.AsyncOpenAI(base_url=gateway.v1, api_key=gateway.key, max_retries=0)
        kwargs: dict[str, Any] = {
            "model": gateway.model,
            "messages": CHAT,
            "max_tokens": 30,
            "seed": 21,
        }
        plain = await client.chat.completions.create(**kwargs)
        stream = await client.chat.completions.create(
            stream=True, stream_options={"include_usage": True}, **kwargs
        )
        chunks = [chunk async for chunk in stream]
        await client.close()
        return plain, chunks

    plain, chunks = asyncio.run(run())
    assert chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1
    choice_chunks = [c for c in chunks if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in choice_chunks)
    assert text == plain.choices[0].message.content
    assert choice_chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in choice_chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.model_dump() == plain.usage.model_dump()


def test_streaming_is_real(gateway: Any) -> None:
    """The first tokens reach the client while the engine is still generating the rest: the
    engine is held (paused) once the first content chunk is in, so the rest can only come after
    it; a gateway that buffered the answer would deliver nothing before the engine finished."""
    body = {
        "model": gateway.model,
        "messages": CHAT,
        "max_tokens": 200,
        "ignore_eos": True,  # what openai's extra_body={"ignore_eos": True} sends
        "stream": True,
    }
    before = gateway.engine_stats()["tokens_generated"]
    lines: list[str] = []
    with httpx.stream(
        "POST", f"{gateway.v1}/chat/completions", json=body, headers=gateway.headers()
    ) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for data in sse_data(resp):
            lines.append(data)
            if len(lines) == 2:  # lines[0] is the role chunk, lines[1] the first text
                with engine_paused(gateway.engine_url):
                    at_first = gateway.engine_stats()
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(x) for x in lines[:-1]]
    content_chunks = sum(
        1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")
    )
    assert content_chunks > 20
    assert at_first["running"] == 1, at_first  # the call was still generating ...
    assert at_first["tokens_generated"] - before < 200, at_first  # ... its first chunk was out


# --- tools ----------------------------------------------------------------------------------


def test_named_tool_choice_forces_a_valid_call(client: openai.OpenAI, gateway: Any) -> None:
    for seed in (1, 2, 3):
        reply = client.chat.completions.create(
            model=gateway.model,
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[WEATHER, CLOCK],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            seed=seed,
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        calls = choice.message.tool_calls or []
        assert len(calls) == 1 and calls[0].type == "function"
        assert calls[0].function.name == "get_weather" and calls[0].id
        assert satisfies_weather(json.loads(calls[0].function.arguments))


def test_required_tool_choice_picks_one_of_the_tools(client: openai.OpenAI, gateway: Any) -> None:
    for seed in range(4):
        reply = client.chat.completions.create(
            model=gateway.model,
            messages=[{"role": "user", "content": "Time or weather?"}],
            tools=[WEATHER, CLOCK],
            tool_choice="required",
            seed=seed,
        )
        call = (reply.choices[0].message.tool_calls or [])[0]
        args = json.loads(call.function.arguments)
        if call.function.name == "get_time":
            assert args["zone"] in ("UTC", "CET")
        else:
            assert call.function.name == "get_weather" and satisfies_weather(args)


def test_streamed_forced_call_and_the_follow_up_turn(
    client: openai.OpenAI, gateway: Any, tokenizer: Any
) -> None:
    question = [{"role": "user", "content": "Weather in Oslo?"}]
    stream = client.chat.completions.create(
        model=gateway.model,
        messages=question,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        stream=True,
    )
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        for c in chunk.choices:
            assert not c.delta.content
            for d in c.delta.tool_calls or []:
                slot = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] += d.id or ""
                slot["name"] += (d.function.name or "") if d.function else ""
                slot["arguments"] += (d.function.arguments or "") if d.function else ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls" and list(calls) == [0]
    call = calls[0]
    assert call["name"] == "get_weather" and satisfies_weather(json.loads(call["arguments"]))

    # the agent runs the tool and sends everything back (assistant content null + tool result)
    history: list[dict[str, Any]] = [
        *question,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call["id"], "content": '{"temp": 3}'},
    ]
    reply = client.chat.completions.create(
        model=gateway.model, messages=history, tools=[WEATHER], max_tokens=8
    )
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == prompt_len(tokenizer, history, [WEATHER])


def test_tool_choice_none_offers_no_tools(client: openai.OpenAI, tokenizer: Any) -> None:
    reply = client.chat.completions.create(
        model="default", messages=CHAT, tools=[WEATHER], tool_choice="none", max_tokens=3
    )
    assert reply.usage is not None and reply.usage.prompt_tokens == prompt_len(tokenizer, CHAT)
    assert reply.choices[0].message.tool_calls is None


def test_response_format_json_schema(client: openai.OpenAI, gateway: Any) -> None:
    schema = {
        "type": "object",
        "properties": {
            "answer": {"type": "string", "enum": ["yes", "no", "maybe"]},
            "sure": {"type": "boolean"},
        },
        "required": ["answer", "sure"],
        "additionalProperties": False,
    }
    for seed in (1, 2):
        reply = client.chat.completions.create(
            model=gateway.model,
            messages=[{"role": "user", "content": "Answer in JSON."}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "verdict", "schema": schema, "strict": True},
            },
            seed=seed,
        )
        value = json.loads(reply.choices[0].message.content or "")
        assert value["answer"] in ("yes", "no", "maybe") and isinstance(value["sure"], bool)
        assert set(value) == {"answer", "sure"}
    loose = client.chat.completions.create(
        model=gateway.model,
        messages=[{"role": "user", "content": "JSON please."}],
        response_format={"type": "json_object"},
        max_tokens=8,
    )
    assert (loose.choices[0].message.content or "").lstrip()[:1] == "{"


# --- errors ---------------------------------------------------------------------------------


def test_errors_reach_the_sdk_as_its_exceptions(client: openai.OpenAI, gateway: Any) -> None:
    wrong = openai.OpenAI(base_url=gateway.v1, api_key="sk-wrong-key-123456", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model=gateway.model, messages=CHAT)

    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"messages": [*CHAT, {"role": "wizard", "content": "hi"}]},
            "unknown role 'wizard' in message 2",
        ),
        ({"messages": []}, "at least one message"),
        (
            {
                "messages": CHAT,
                "tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}],
            },
            "tools[0].function.parameters",
        ),
        (
            {"messages": CHAT, "tools": [{"type": "function", "function": {"parameters": {}}}]},
            "tools[0].function.name",
        ),
        (
            {
                "messages": CHAT,
                "tools": [WEATHER],
                "tool_choice": {"type": "function", "function": {"name": "nope"}},
            },
            "'nope', which is not among the tools",
        ),
        ({"messages": CHAT, "tool_choice": "required"}, "needs tools"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "text only"),
        ({"messages": CHAT, "n": 0}, "n: must be"),
        ({"messages": CHAT, "temperature": "hot"}, "temperature: must be a number"),
        ({"messages": CHAT, "response_format": {"type": "yaml"}}, "response_format.type"),
    ]
    for extra, message in cases:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=gateway.model, **extra)
        assert message in str(err.value), (extra, str(err.value))

    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-nonexistent", messages=CHAT)
    assert "gpt-nonexistent" in str(missing.value) and gateway.model in str(missing.value)


def test_every_prefix_serves_chat(gateway: Any) -> None:
    body = {"model": gateway.model, "messages": CHAT, "max_tokens": 2}
    for prefix in ("/v1", "/gateway/v1", ""):
        resp = httpx.post(
            f"{gateway.url}{prefix}/chat/completions?x=1", json=body, headers=gateway.headers()
        )
        assert resp.status_code == 200, resp.text
        assert resp.json()["choices"][0]["message"]["role"] == "assistant"


# --- helpers (no server) --------------------------------------------------------------------


def test_stream_text_holds_back_partial_stop_strings() -> None:
    assert partial_stop("abc EN", ["END"]) == 2
    assert partial_stop("abc E", ["END", "EX"]) == 1
    assert partial_stop("abc", ["END"]) == 0
    for streamed in (False, True):  # cumulative generations, or streamed ones with deltas
        step = stepper(streamed)
        text = StreamText(["END"])
        assert text.step(step("abc E")) == "abc "
        assert text.step(step("abc EN")) == ""
        assert text.step(step("abc ENX")) == "ENX"
        step = stepper(streamed)
        final = StreamText(["END"])
        assert final.step(step("ab E")) == "ab "
        assert final.step(step("ab ", final=True)) == ""  # the engine trimmed the stop string


def stepper(streamed: bool) -> Callable[..., Generation]:
    """Generations of one stream from its cumulative texts: plain ones, or with the delta."""
    seen = ""

    def step(text: str, final: bool = False) -> Generation:
        nonlocal seen
        delta = text[len(seen) :] if streamed and not final else None
        seen = text
        reason = "stop" if final else None
        return Generation(text, [], [], [], [], finish_reason=reason, delta_text=delta)

    return step


# --- recording --------------------------------------------------------------------------------


def open_session(gateway: Any, **fields: Any) -> OpenedSession:
    return asyncio.run(GatewayAdmin(gateway.url, gateway.admin).open_session(**fields))


def test_session_calls_are_recorded_token_exact(gateway: Any, tokenizer: Any) -> None:
    session = open_session(gateway)
    agent = openai.OpenAI(base_url=gateway.v1, api_key=session["api_key"], max_retries=0)
    reply = agent.chat.completions.create(model=gateway.model, messages=CHAT, max_tokens=10, seed=2)
    streamed = list(
        agent.chat.completions.create(
            model=gateway.model, messages=CHAT, max_tokens=10, seed=3, n=2, stream=True
        )
    )
    assert streamed[-1].choices and streamed[-1].choices[0].finish_reason
    recorded = gateway.state.sessions.lookup(session["api_key"]).completions
    assert len(recorded) == 3
    first = recorded[0]
    assert reply.id == first.completion_id  # the handle for a per-turn reward
    assert first.prompt_ids == gateway.state.policy.render(CHAT)
    assert reply.usage is not None and len(first.output_ids) == reply.usage.completion_tokens
    assert (
        tokenizer.decode(first.output_ids, skip_special_tokens=True)
        == reply.choices[0].message.content
    )
    admin = GatewayAdmin(gateway.url, gateway.admin)
    reward = asyncio.run(admin.reward(session["session_id"], 1.0, completion_id=reply.id))
    assert reward["completion_id"] == reply.id


def test_a_prompt_cache_key_joins_the_session_bound_to_it(
    client: openai.OpenAI, gateway: Any
) -> None:
    session = open_session(gateway, hint="conversation-42")
    client.chat.completions.create(
        model=gateway.model,
        messages=CHAT,
        max_tokens=3,
        extra_body={"prompt_cache_key": "conversation-42"},
    )
    client.chat.completions.create(model=gateway.model, messages=CHAT, max_tokens=3)  # no hint
    assert len(gateway.state.sessions.lookup(session["api_key"]).completions) == 1
    log = (gateway.log_dir / "gateway.log").read_text()
    assert f"session={session['session_id']}" in log
