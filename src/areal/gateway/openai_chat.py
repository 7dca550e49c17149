"""OpenAI Chat Completions, ``POST {prefix}/chat/completions``, served by the policy.

The request becomes policy messages and tools (:mod:`areal.gateway.chat_messages`), the prompt is
rendered and tokenized by the gateway, and the reply is exactly what the engine generated: the
text of its output tokens, tool calls parsed out of that text, and usage counted in tokens the
gateway sent and the engine returned (never re-tokenized). Streams are real: each engine chunk
becomes SSE ``chat.completion.chunk`` objects at once.

Beyond the OpenAI fields, SGLang/vLLM-style sampling knobs are passed through when sent top-level
(the openai SDK's ``extra_body`` puts them there): ``ignore_eos``, ``top_k``, ``min_p``,
``min_tokens``, ``repetition_penalty``. Penalties and ``logit_bias`` change the logits, which the
trainer cannot replay: a call recorded for training that sends one is refused with a 400 naming it
(:mod:`areal.gateway.replayable`); other calls pass them on. ``logprobs: true`` returns the behaviour log-prob of each
chosen token (what RL records); ``top_logprobs`` alternatives are not computed (empty lists).
Unknown top-level keys (``store``, ``metadata``, ``prompt_cache_key``, ``parallel_tool_calls``,
...) are ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from areal.core.tool_calls import StreamEvent, ToolCall, ToolCallParser, new_call_id
from areal.gateway.chat_messages import (
    JSON_OBJECT_SCHEMA,
    OutputStream,
    ToolPlan,
    allowed_tools_plan,
    bad,
    grammar_params,
    normalize_messages,
    normalize_tools,
    openai_tool_choice,
    plan_tools,
    split_output,
    stop_strings,
    type_name,
)
from areal.gateway.episodes import Episode, check_not_aborted
from areal.gateway.errors import GatewayError, openai_error_body
from areal.gateway.gateway_state import GatewayState, state_of
from areal.gateway.policy import Generation
from areal.gateway.replayable import check_replayable
from areal.gateway.request_body import read_json
from areal.gateway.request_log import LOG_FIELDS
from areal.gateway.sse import EventStreamResponse, sse_event
from areal.host import fast_json

MAX_CHOICES = 64
ANY_JSON = "$$ANY$$"  # SGLang's json_schema for "any JSON value" (json_schema without a schema)


# --- the request ----------------------------------------------------------------------------


@dataclass
class ChatRequest:
    """A validated Chat Completions request, ready for the policy."""

    messages: list[dict[str, Any]]
    plan: ToolPlan
    sampling: dict[str, Any]  # everything for PolicyService.sampling except the prompt length
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    episode: Episode = field(default_factory=Episode)
    stops: list[str] = field(default_factory=list)
    dropped_tools: list[str] = field(default_factory=list)  # hosted tools left out, by type


def _number(body: dict[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise bad(key, f"must be a number, got {type_name(value)}")
    if not low <= value <= high:
        raise bad(key, f"must be between {low:g} and {high:g}, got {value}")
    return float(value)


def _integer(body: dict[str, Any], key: str, low: int, high: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(key, f"must be an integer, got {type_name(value)}")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise bad(key, f"must be {bound}, got {value}")
    return value


def _flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad(key, f"must be true or false, got {type_name(value)}")
    return value


def _response_format(value: Any) -> Any:
    """The engine's ``json_schema`` for ``response_format`` (None for plain text)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad("response_format", f"must be an object, got {type_name(value)}")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT_SCHEMA
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise bad("response_format.json_schema", "must be an object with a 'schema'")
        schema = spec.get("schema")
        if schema is None:
            return ANY_JSON
        if not isinstance(schema, dict):
            raise bad("response_format.json_schema.schema", "must be a JSON schema object")
        return json.dumps(schema)
    raise bad("response_format.type", f"must be text, json_object or json_schema, got {kind!r}")


def _extra_sampling(body: dict[str, Any]) -> dict[str, Any]:
    """SGLang sampling params sent top-level (OpenAI penalties, vendor ``extra_body`` knobs)."""
    extra: dict[str, Any] = {}
    for key in ("presence_penalty", "frequency_penalty"):
        value = _number(body, key, -2.0, 2.0)
        if value:
            extra[key] = value
    if (value := _number(body, "repetition_penalty", 0.0, 10.0)) is not None and value != 1.0:
        extra["repetition_penalty"] = value
    if _flag(body, "ignore_eos"):
        extra["ignore_eos"] = True
    if (top_k := _integer(body, "top_k", -1)) is not None and top_k != 0:
        extra["top_k"] = top_k
    if (min_p := _number(body, "min_p", 0.0, 1.0)) is not None:
        extra["min_p"] = min_p
    if min_tokens := _integer(body, "min_tokens", 0):
        extra["min_new_tokens"] = min_tokens
    bias = body.get("logit_bias")
    if bias:
        if not isinstance(bias, dict):
            raise bad("logit_bias", f"must be an object, got {type_name(bias)}")
        if any(value != 0 for value in bias.values()):  # all zeros: no bias at all
            extra["logit_bias"] = bias
    return extra


def parse_request(
    body: dict[str, Any], parser: ToolCallParser, episode: Episode | None = None
) -> ChatRequest:
    """Validate everything the policy needs; every problem is a 400 naming the field."""
    messages = normalize_messages(body.get("messages"))
    dropped: list[str] = []
    tools = normalize_tools(body.get("tools"), dropped=dropped)
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        plan = allowed_tools_plan(choice, tools, parser, "tool_choice")
    else:
        plan = plan_tools(tools, openai_tool_choice(choice), parser)
    schema = _response_format(body.get("response_format"))
    max_tokens = _integer(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 1)
    temperature = _number(body, "temperature", 0.0, 2.0)
    top_p = _number(body, "top_p", 0.0, 1.0)
    if top_p == 0.0:  # "only the likeliest token": greedy
        temperature, top_p = 0.0, None
    stops = stop_strings(body.get("stop"))
    extra = {**_extra_sampling(body), **grammar_params(plan, schema)}
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise bad("stream_options", f"must be an object, got {type_name(stream_options)}")
    top_logprobs = _integer(body, "top_logprobs", 0, 20)
    logprobs = _flag(body, "logprobs") or bool(top_logprobs)
    return ChatRequest(
        messages=messages,
        plan=plan,
        sampling={
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "stop": stops or None,
            "seed": _integer(body, "seed", -(2**63), 2**64 - 1),
            "extra": extra,
        },
        n=_integer(body, "n", 1, MAX_CHOICES) or 1,
        stream=_flag(body, "stream"),
        include_usage=bool(stream_options and stream_options.get("include_usage") is True),
        logprobs=logprobs,
        episode=episode or Episode(),
        stops=stops,
        dropped_tools=dropped,
    )


def choice_sampling(base: dict[str, Any], index: int) -> dict[str, Any]:
    """Choice ``index`` of ``n``: a seeded request gives each choice its own seed (seed + index),
    so choice 0 is exactly what the same request with ``n=1`` gives."""
    if index == 0 or base.get("sampling_seed") is None:
        return base
    seed = base["sampling_seed"] + index
    return {**base, "sampling_seed": seed if seed < 2**64 else seed - 2**64}


# --- answering ------------------------------------------------------------------------------


def tool_call_json(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def finish_reason(gen: Generation, calls: list[ToolCall]) -> str:
    """``tool_calls``, or ``length`` when the limit cut the output (a cut-off call included)."""
    if calls and not any(call.truncated for call in calls):
        return "tool_calls"
    return "length" if gen.finish_reason == "length" else "stop"


def token_logprobs(tokenizer: Any, ids: list[int], logprobs: list[float]) -> list[dict[str, Any]]:
    """OpenAI ``logprobs.content`` entries for output tokens, as the engine sampled them."""
    out = []
    for token_id, logprob in zip(ids, logprobs):
        text = tokenizer.decode([token_id])
        out.append(
            {
                "token": text,
                "logprob": logprob if math.isfinite(logprob) else -9999.0,
                "bytes": list(text.encode("utf-8")),
                "top_logprobs": [],
            }
        )
    return out


def usage_json(prompt_ids: list[int], gens: list[Generation]) -> dict[str, Any]:
    completion = sum(len(g.output_ids) for g in gens)
    usage: dict[str, Any] = {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": completion,
        "total_tokens": len(prompt_ids) + completion,
    }
    cached = gens[0].meta.get("cached_tokens") if gens else None
    if isinstance(cached, int):
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


async def complete(
    request: web.Request, state: GatewayState, chat: ChatRequest, prompt_ids: list[int]
) -> web.Response:
    base = state.policy.sampling(len(prompt_ids), **chat.sampling)
    gens = await asyncio.gather(
        *(
            state.policy.generate(prompt_ids, choice_sampling(base, i), sticky=chat.episode.sticky)
            for i in range(chat.n)
        )
    )
    record_ids = [await chat.episode.record(request, state, gen) for gen in gens]
    for gen in gens:
        check_not_aborted(gen)
    parser = state.policy.tool_parser
    choices = []
    for i, gen in enumerate(gens):
        content, calls = split_output(chat.plan, parser, gen.text, gen.finish_reason == "length")
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content if content or not calls else None,
            "refusal": None,
        }
        if calls:
            message["tool_calls"] = [tool_call_json(c) for c in calls]
        logprobs = None
        if chat.logprobs:
            logprobs = {
                "content": token_logprobs(state.policy.tokenizer, gen.output_ids, gen.logprobs),
                "refusal": None,
            }
        choices.append(
            {
                "index": i,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": finish_reason(gen, calls),
            }
        )
    # A recorded completion's id is the handle for rewarding it (POST /rl/sessions/{id}/reward).
    completion_id = record_ids[0] if chat.n == 1 and record_ids[0] else new_call_id("chatcmpl-")
    chat.episode.answered(request, completion_id)
    return web.json_response(
        {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": state.policy.model_id,
            "choices": choices,
            "usage": usage_json(prompt_ids, list(gens)),
            "system_fingerprint": None,
        },
        dumps=fast_json.dumps,
    )


# --- streaming ------------------------------------------------------------------------------


class ChoiceStream:
    """One choice of a streamed completion: cumulative generations in, chunk ``choices`` out.

    The text and tool calls come from the shared :class:`OutputStream` (stop strings held back,
    calls parsed by the policy's parser). Whitespace-only text is held until real text follows, so
    a pure tool-call reply streams no stray newlines as content (as the non-streamed reply strips
    them).
    """

    def __init__(
        self, index: int, plan: ToolPlan, parser: ToolCallParser, stops: list[str], tokenizer: Any
    ) -> None:
        self.index = index
        self.output = OutputStream(plan, parser, stops)
        self.tokenizer = tokenizer  # set when log-probs were asked for
        self.logprobs_sent = 0
        self.held_space = ""
        self.calls: list[ToolCall] = []

    def entry(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"index": self.index, "delta": delta, "logprobs": None, "finish_reason": finish}

    def role(self) -> dict[str, Any]:
        """The first chunk; a forced call's reply has no text, so its content is null (as
        OpenAI's API streams a tool call: a client adds no empty text part)."""
        return self.entry({"role": "assistant", "content": None if self.output.plan.forced else ""})

    def step(self, gen: Generation) -> list[dict[str, Any]]:
        out = [e for e in (self._event(ev) for ev in self.output.step(gen)) if e is not None]
        if gen.finished:
            if self.held_space and not self.calls:
                out.append(self.entry({"content": self.held_space}))
            out.append(self.entry({}, finish_reason(gen, self.calls)))
        if self.tokenizer is not None and out and len(gen.output_ids) > self.logprobs_sent:
            new = slice(self.logprobs_sent, len(gen.output_ids))
            out[0]["logprobs"] = {
                "content": token_logprobs(self.tokenizer, gen.output_ids[new], gen.logprobs[new]),
                "refusal": None,
            }
            self.logprobs_sent = len(gen.output_ids)
        return out

    def _event(self, event: StreamEvent) -> dict[str, Any] | None:
        if event.kind == "tool_call" and event.call is not None:
            self.held_space = ""
            call = {"index": len(self.calls), **tool_call_json(event.call)}
            self.calls.append(event.call)
            return self.entry({"tool_calls": [call]})
        text = event.text
        if not text.strip():
            self.held_space += text
            return None
        text, self.held_space = self.held_space + text, ""
        return self.entry({"content": text})


class _ChunkEvents:
    """SSE events of ``chat.completion.chunk`` objects: the fields every chunk of a stream
    shares are serialized once, and each chunk adds its one ``choices`` entry."""

    def __init__(self, envelope: dict[str, Any]) -> None:
        head = fast_json.dumps_bytes({**envelope, "choices": []})
        self.prefix = b"data: " + head[: -len(b"[]}")] + b"["

    def event(self, entry: dict[str, Any]) -> bytes:
        return self.prefix + fast_json.dumps_bytes(entry) + b"]}\n\n"


async def _merge(streams: list[AsyncIterator[Any]]) -> AsyncGenerator[Any, None]:
    """Items of several async iterators as they come (the n choices generate concurrently)."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield item
        return
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    async def pump(stream: AsyncIterator[Any]) -> None:
        try:
            async for item in stream:
                await queue.put(("item", item))
            await queue.put(("done", None))
        except Exception as err:
            await queue.put(("error", err))

    tasks = [asyncio.create_task(pump(s)) for s in streams]
    try:
        running = len(tasks)
        while running:
            kind, value = await queue.get()
            if kind == "error":
                raise value
            if kind == "done":
                running -= 1
            else:
                yield value
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def stream_completion(
    request: web.Request, state: GatewayState, chat: ChatRequest, prompt_ids: list[int]
) -> web.StreamResponse:
    base = state.policy.sampling(len(prompt_ids), **chat.sampling)
    engines = [
        state.policy.stream(prompt_ids, choice_sampling(base, i), sticky=chat.episode.sticky)
        for i in range(chat.n)
    ]
    try:
        # Wait for each choice's first token before answering 200: an engine that refuses the
        # request (a schema it cannot compile, a prompt too long) still gets a proper HTTP error.
        firsts = await _first_items(engines)
        return await _write_stream(request, state, chat, prompt_ids, engines, firsts)
    finally:
        for engine in engines:  # closing an engine stream stops its generation
            aclose = getattr(engine, "aclose", None)
            if aclose is not None:
                await aclose()


async def _first_items(streams: list[AsyncIterator[Generation]]) -> list[Generation]:
    tasks = [asyncio.ensure_future(anext(s)) for s in streams]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _write_stream(
    request: web.Request,
    state: GatewayState,
    chat: ChatRequest,
    prompt_ids: list[int],
    engines: list[AsyncIterator[Generation]],
    firsts: list[Generation],
) -> web.StreamResponse:
    parser = state.policy.tool_parser
    tokenizer = state.policy.tokenizer if chat.logprobs else None
    choices = [ChoiceStream(i, chat.plan, parser, chat.stops, tokenizer) for i in range(chat.n)]
    finals: list[Generation | None] = [None] * chat.n
    latest: list[Generation] = list(firsts)
    stream_id = new_call_id("chatcmpl-")
    envelope = {
        "id": stream_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": state.policy.model_id,
        "system_fingerprint": None,
    }
    if chat.include_usage:
        envelope["usage"] = None
    chat.episode.answered(request, stream_id)

    async def generations(i: int) -> AsyncIterator[tuple[int, Generation]]:
        yield i, firsts[i]
        if not firsts[i].finished:
            async for gen in engines[i]:
                yield i, gen

    response = EventStreamResponse()
    await response.prepare(request)

    async def send(payload: dict[str, Any]) -> None:
        await response.write(sse_event(payload))

    chunk = _ChunkEvents(envelope)
    pending = [chunk.event(choice.role()) for choice in choices]
    try:
        merged = _merge([generations(i) for i in range(chat.n)])
        async with contextlib.aclosing(merged):
            async for i, gen in merged:
                latest[i] = gen
                if gen.finished:
                    finals[i] = gen
                    await chat.episode.record(request, state, gen)
                    check_not_aborted(gen)
                pending += [chunk.event(entry) for entry in choices[i].step(gen)]
                if pending and None in finals:  # what one engine step gave leaves in one write
                    await response.write(b"".join(pending))
                    pending = []
        if chat.include_usage:
            done = [g for g in finals if g is not None]
            usage = {**envelope, "choices": [], "usage": usage_json(prompt_ids, done)}
            pending.append(sse_event(usage))
        await response.write_eof(b"".join([*pending, b"data: [DONE]\n\n"]))  # one send
    except GatewayError as err:  # headers are gone: the error travels as an SSE event
        with contextlib.suppress(ConnectionResetError):
            await response.write(b"".join(pending))
            await send(openai_error_body(err.status, err.message, err.param, err.code))
    except ConnectionResetError:  # the client left; closing the engine streams stops generation
        pass
    finally:  # choices cut short (client gone, engine failed) are counted as aborted
        for i, gen in enumerate(latest):
            if finals[i] is None:
                await chat.episode.record(request, state, gen)
    return response


# --- the route ------------------------------------------------------------------------------


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    body = await read_json(request)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("model", f"must be a string, got {type_name(model)}")
    request[LOG_FIELDS].update(model=model or state.policy.model_id)
    if not state.policy.serves(model):
        if state.upstream is not None:
            response: web.StreamResponse = await state.upstream.forward(
                request, body, "/chat/completions"
            )
            return response
        raise GatewayError(
            404,
            f"model {model!r} is not served here: the policy is {state.policy.model_id!r} "
            "(or 'default'), and no api_gateway channel is configured for other models",
            param="model",
            code="model_not_found",
        )
    request[LOG_FIELDS].update(route="local")
    chat = parse_request(body, state.policy.tool_parser)
    state.policy.note_dropped_tools(request[LOG_FIELDS], chat.dropped_tools)
    chat.episode = episode = await Episode.of(request, state, body)  # after the 400s: admits
    check_replayable(request, chat.sampling["extra"])  # a recorded call: what the trainer replays
    prompt_ids = state.policy.render(
        chat.messages,
        chat.plan.tools,
        chat.plan.prefix,
        history=episode.history(request),
        log_fields=request[LOG_FIELDS],
    )
    if chat.stream:
        return await stream_completion(request, state, chat, prompt_ids)
    return await complete(request, state, chat, prompt_ids)


def add_routes(app: web.Application, prefixes: tuple[str, ...]) -> None:
    """Register this protocol's routes under each prefix."""
    for prefix in prefixes:
        app.router.add_post(f"{prefix}/chat/completions", chat_completions)
