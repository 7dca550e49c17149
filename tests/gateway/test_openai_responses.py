"""The Responses API through the official ``openai`` SDK, against a real gateway and real engine.

The policy is untrained, so its free text is noise: these tests check shapes the SDK parses,
token counts against the tokenizer, and structure that constrained decoding guarantees (forced
function calls, JSON text formats), greedy where the exact text matters.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import httpx
import openai
import pytest
from aiohttp import web
from pydantic import BaseModel

from areal.gateway.openai_responses import input_messages, output_items, parse_request
from areal.gateway.policy import Generation
from areal.host.http_server import ServerThread

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Oslo"]},
            "metric": {"type": "boolean"},
            "note": {"type": "string", "maxLength": 12},
        },
        "required": ["city", "metric", "note"],
        "additionalProperties": False,
    },
    "strict": True,
}
TIME = {
    "type": "function",
    "name": "get_time",
    "description": "The time in a zone.",
    "parameters": {
        "type": "object",
        "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["zone"],
        "additionalProperties": False,
    },
    "strict": True,
}


class Forecast(BaseModel):
    city: Literal["Paris", "Oslo"]
    sunny: bool


@pytest.fixture(scope="module")
def client(gateway: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.v1, api_key=gateway.key, max_retries=0)


def prompt_len(tokenizer: Any, messages: list[dict], tools: list[dict] | None = None) -> int:
    """What the policy tokenizer makes of a chat: the count ``usage.input_tokens`` must match."""
    chat_tools = [
        {
            "type": "function",
            "function": {k: t[k] for k in ("name", "description", "parameters")},
        }
        for t in tools or []
    ]
    text = tokenizer.apply_chat_template(
        messages, tools=chat_tools or None, tokenize=False, add_generation_prompt=True
    )
    return len(tokenizer.encode(text, add_special_tokens=False))


def check_weather(arguments: str) -> None:
    args = json.loads(arguments)
    assert set(args) == {"city", "metric", "note"}
    assert args["city"] in ("Paris", "Oslo")
    assert isinstance(args["metric"], bool)
    assert isinstance(args["note"], str) and len(args["note"]) <= 12


def test_text_response_counts_the_rendered_prompt(
    gateway: Any, client: openai.OpenAI, tokenizer: Any
) -> None:
    response = client.responses.create(
        model=gateway.model,
        instructions="Be brief.",
        input=[
            {"role": "developer", "content": "Answer in English."},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Say "},
                    {"type": "input_text", "text": "hello"},
                ],
            },
        ],
        max_output_tokens=6,
        temperature=0,
        store=False,
        metadata={"run": "test"},
        reasoning={"effort": "low"},
        parallel_tool_calls=True,
        prompt_cache_key="episode-1",
    )
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.model == gateway.model
    message = response.output[0]
    assert message.type == "message" and message.id.startswith("msg_")
    assert response.output_text == message.content[0].text
    expected = [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Answer in English."},
        {"role": "user", "content": "Say hello"},
    ]
    usage = response.usage
    assert usage is not None
    assert usage.input_tokens == prompt_len(tokenizer, expected)
    assert 1 <= usage.output_tokens <= 6
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert response.metadata == {"run": "test"} and response.temperature == 0
    log = (gateway.log_dir / "gateway.log").read_text()
    assert "route=local" in log and "path=/v1/responses" in log


def test_max_output_tokens_makes_the_response_incomplete(
    gateway: Any, client: openai.OpenAI
) -> None:
    response = client.responses.create(
        model=gateway.model, input="Tell me a long story.", max_output_tokens=3, temperature=0
    )
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == 3
    assert response.output[0].status == "incomplete"


def test_stream_events_arrive_in_order_and_deltas_make_the_text(
    gateway: Any, client: openai.OpenAI
) -> None:
    request: dict[str, Any] = {
        "model": gateway.model,
        "input": "Count to ten.",
        "max_output_tokens": 12,
        "temperature": 0,
    }
    events = list(client.responses.create(stream=True, **request))
    kinds = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[4 : 4 + len(deltas)] == ["response.output_text.delta"] * len(deltas)
    assert kinds[4 + len(deltas) :] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",  # 12 tokens of noise hit the limit, as OpenAI says it
    ]
    assert len(deltas) > 1  # tokens leave as they are generated, not in one piece at the end
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = next(e for e in events if e.type == "response.output_text.done")
    final = events[-1].response
    assert "".join(deltas) == done.text == final.output_text
    assert final.usage is not None and final.usage.output_tokens == 12
    assert final.id == events[0].response.id
    # Greedy decoding: the same request unstreamed gives the same text.
    assert client.responses.create(**request).output_text == done.text


def test_json_text_format_parses_with_the_sdk_helpers(gateway: Any, client: openai.OpenAI) -> None:
    parsed = client.responses.parse(
        model=gateway.model, input="Weather in Paris?", text_format=Forecast
    )
    assert parsed.status == "completed"
    assert isinstance(parsed.output_parsed, Forecast)
    with client.responses.stream(
        model=gateway.model, input="Weather in Oslo?", text_format=Forecast
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[-1] == "response.completed" and "response.output_text.delta" in kinds
    assert isinstance(final.output_parsed, Forecast)
    plain = client.responses.create(
        model=gateway.model,
        input="Any JSON.",
        text={
            "format": {
                "type": "json_schema",
                "name": "forecast",
                "schema": Forecast.model_json_schema(),
            }
        },
    )
    Forecast.model_validate_json(plain.output_text)
    assert plain.text is not None and plain.text.format.type == "json_schema"
    # json_object: an object (an untrained policy rarely closes it, but it starts as one).
    anything = client.responses.create(
        model=gateway.model,
        input="Any JSON.",
        text={"format": {"type": "json_object"}},
        max_output_tokens=4,
    )
    assert anything.output_text.lstrip()[:1] == "{"


def test_forced_call_then_a_turn_with_its_output(
    gateway: Any, client: openai.OpenAI, tokenizer: Any
) -> None:
    question = {"role": "user", "content": "Weather in Paris?"}
    first = client.responses.create(
        model=gateway.model,
        input=[question],
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "name": "get_weather"},
    )
    assert first.status == "completed"
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.id is not None and call.id.startswith("fc_") and call.call_id
    check_weather(call.arguments)
    forced_prefix = gateway.state.policy.tool_parser.forced_prefix()
    assert first.usage is not None
    assert first.usage.input_tokens == prompt_len(tokenizer, [question], [WEATHER, TIME]) + len(
        tokenizer.encode(forced_prefix, add_special_tokens=False)
    )

    second = client.responses.create(
        model=gateway.model,
        input=[
            question,
            *first.output,
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
        ],
        tools=[WEATHER, TIME],
        max_output_tokens=4,
        temperature=0,
    )
    history = [
        question,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny, 21 C"},
    ]
    assert second.usage is not None
    assert second.usage.input_tokens == prompt_len(tokenizer, history, [WEATHER, TIME])
    assert second.output and second.tools[0].name == "get_weather"


def test_required_call_streams_with_the_sdk_helper(gateway: Any, client: openai.OpenAI) -> None:
    with client.responses.stream(
        model=gateway.model,
        input="Weather or time?",
        tools=[WEATHER, TIME],
        tool_choice="required",
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[2:] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    [call] = final.output
    assert call.type == "function_call"
    if call.name == "get_weather":
        check_weather(call.arguments)
    else:
        assert call.name == "get_time" and json.loads(call.arguments)["zone"] in ("UTC", "CET")
    assert call.parsed_arguments == json.loads(call.arguments)  # strict tools: the SDK parses them


def test_bad_requests_are_openai_errors(gateway: Any, client: openai.OpenAI) -> None:
    def refused(**body: Any) -> openai.BadRequestError:
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(**{"model": gateway.model, "input": "hi", **body})
        return caught.value

    err = refused(tools=[{"name": "no_type"}])
    assert err.body["param"] == "tools[0].type"
    err = refused(previous_response_id="resp_123")
    assert "previous_response_id is not supported: send the full input" in err.message
    err = refused(tools=[WEATHER], tool_choice={"type": "function", "name": "nope"})
    assert "nope" in err.message
    err = refused(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])
    assert "input_image" in err.message
    assert "max_output_tokens" in refused(max_output_tokens="many").message
    assert "function_call" in refused(input=[{"type": "item_reference", "id": "x"}]).message
    assert "weather" in refused(stream=True, tools=[WEATHER, WEATHER]).message
    # What the engine refuses is a plain 400 even when streaming: the stream has not started.
    bad_schema = {"format": {"type": "json_schema", "name": "x", "schema": {"$ref": "#/nope"}}}
    assert "json_schema" in refused(stream=True, text=bad_schema).message
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=gateway.v1, api_key="sk-wrong-key-123456", max_retries=0
        ).responses.create(model=gateway.model, input="hi")
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model="gpt-elsewhere", input="hi")
    assert gateway.model in missing.value.message


def test_every_prefix_and_the_async_client(gateway: Any) -> None:
    async def run() -> None:
        aclient = openai.AsyncOpenAI(
            base_url=gateway.url + "/gateway/v1", api_key=gateway.key, max_retries=0
        )
        response = await aclient.responses.create(model="default", input="hi", max_output_tokens=2)
        assert response.usage is not None and response.usage.output_tokens <= 2
        stream = await aclient.responses.create(
            model=gateway.model, input="hi", max_output_tokens=2, stream=True
        )
        kinds = [event.type async for event in stream]
        assert kinds[0] == "response.created" and kinds[-1] in (
            "response.completed",
            "response.incomplete",
        )
        await aclient.close()

    asyncio.run(run())
    raw = httpx.post(
        gateway.url + "/responses",
        json={"model": gateway.model, "input": "hi", "max_output_tokens": 2},
        headers=gateway.headers(),
    )
    assert raw.status_code == 200 and raw.json()["object"] == "response"


def test_history_items_become_one_assistant_turn_and_calls_are_read_from_text(
    gateway: Any,
) -> None:
    """The model's text and calls of one turn render as one assistant message (so the next
    prompt extends the last one), and calls in free text come back as function_call items."""
    messages = input_messages(
        [
            {"type": "message", "role": "user", "content": "hi"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
            {"type": "function_call", "call_id": "c1", "name": "get_time", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "noon"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "midnight"}],
            },
        ]
    )
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert messages[1]["content"] == "Let me look."
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["c1", "c2"]
    assert messages[3] == {"role": "tool", "tool_call_id": "c2", "content": "midnight"}

    parser = gateway.state.policy.tool_parser
    req = parse_request({"input": "time?", "tools": [TIME]}, parser)
    text = (
        'Checking.\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    )
    gen = Generation(text, [5, 6], [0.0, 0.0], [0, 0], [1, 2], finish_reason="stop")
    message, call = output_items(req, gen, parser)
    assert message["content"][0]["text"] == "Checking."
    assert call["type"] == "function_call" and call["name"] == "get_time"
    assert json.loads(call["arguments"]) == {"zone": "UTC"}
    # With tool_choice "none" nothing is read out of the text.
    req = parse_request({"input": "time?", "tools": [TIME], "tool_choice": "none"}, parser)
    [only] = output_items(req, gen, parser)
    assert only["type"] == "message" and only["content"][0]["text"] == text


def test_other_models_go_through_the_channel(start_gateway: Any) -> None:
    """A non-policy model id is forwarded to the upstream's /responses with its route's cap."""
    seen: list[dict[str, Any]] = []

    async def upstream_responses(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        text = f"judged with max_output_tokens={body.get('max_output_tokens')}"
        return web.json_response(
            {
                "id": "resp_upstream",
                "object": "response",
                "created_at": 0,
                "status": "completed",
                "model": body["model"],
                "output": [
                    {
                        "type": "message",
                        "id": "msg_up",
                        "status": "completed",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": text, "annotations": []}],
                    }
                ],
                "parallel_tool_calls": True,
                "tool_choice": "auto",
                "tools": [],
            }
        )

    app = web.Application()
    app.router.add_post("/v1/responses", upstream_responses)
    upstream = ServerThread(app, "127.0.0.1", 0).start()
    config = {
        "api_gateway": {"base_url": upstream.url + "/v1", "api_key": "sk-upstream-0123456789"},
        "model_routing": {
            "policy_model": {"model_id": "areal-tiny", "max_tokens": 256},
            "judge_model": {"model_id": "judge", "max_tokens": 64},
        },
    }
    try:
        with start_gateway(config=config) as gw:
            client = openai.OpenAI(base_url=gw.v1, api_key=gw.key, max_retries=0)
            reply = client.responses.create(model="judge", input="grade", max_output_tokens=9000)
            assert reply.output_text == "judged with max_output_tokens=64"
            assert seen[0]["input"] == "grade"
            log = (gw.log_dir / "gateway.log").read_text()
            assert "model=judge route=127.0.0.1" in log
    finally:
        upstream.stop()
