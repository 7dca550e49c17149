"""Anthropic Messages: ``POST {prefix}/messages`` and ``POST {prefix}/messages/count_tokens``.

The request becomes the policy's chat (:mod:`areal.gateway.anthropic_request`), is served by the
policy, and is answered in Anthropic's shapes. Streams carry the whole named-event sequence with
``usage`` in ``message_start`` and ``message_delta``: without them the SDK's stream accumulator
breaks and Claude Code quietly repeats the call without streaming, which would record the episode
twice.

Tools run on the machinery every protocol shares (:mod:`areal.gateway.chat_messages`): a forced
call is under the same grammar as Chat Completions' required/named choice, and calls are read out
of the output by the policy's registered tool-call parser. Only the shapes are Anthropic's:
``tool_use`` blocks with ``toolu_`` ids, and a forced call's arguments streamed as
``input_json_delta`` while they are generated.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any, cast

from aiohttp import web

from areal.core.tool_calls import new_call_id
from areal.gateway.anthropic_request import ChatRequest, parse_request, sampling_options
from areal.gateway.chat_messages import (
    ForcedCallReader,
    OutputStream,
    cut_forced_call,
    partial_arguments,
    split_output,
)
from areal.gateway.episodes import Episode, check_not_aborted
from areal.gateway.errors import GatewayError, anthropic_error_body
from areal.gateway.gateway_state import GatewayState, state_of
from areal.gateway.policy import Generation
from areal.gateway.request_body import read_json
from areal.gateway.request_log import LOG_FIELDS
from areal.gateway.sse import EventStreamResponse, sse_event

# --- the prompt ------------------------------------------------------------------------------


def render_prompt(
    state: GatewayState,
    chat: ChatRequest,
    history: list[int] | None = None,
    log_fields: dict[str, Any] | None = None,
) -> list[int]:
    """The prompt ids: the chat, the prefill, and for a forced call the parser's opening tag
    (``history``: the episode's tokens so far; ``log_fields``: the request's log line; see
    :meth:`PolicyService.render`)."""
    prefix = chat.prefill + chat.plan.prefix
    return state.policy.render(
        chat.messages, chat.plan.tools, prefix, history=history, log_fields=log_fields
    )


# --- the reply -------------------------------------------------------------------------------


def _message_id() -> str:
    return "msg_" + secrets.token_hex(12)


def _tool_id() -> str:
    return new_call_id("toolu_")


def _usage(prompt_tokens: int, output_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def reply_blocks(state: GatewayState, chat: ChatRequest, gen: Generation) -> list[dict[str, Any]]:
    """The content blocks of a finished generation, its calls read by the policy's parser (a
    forced call the limit cut is a ``tool_use`` block with its input as far as it was written)."""
    cut = gen.finish_reason == "length"
    text, calls = split_output(chat.plan, state.policy.tool_parser, gen.text, cut)
    blocks: list[dict[str, Any]] = []
    if text or not calls:
        blocks.append({"type": "text", "text": text})
    for call in calls:
        blocks.append(
            {
                "type": "tool_use",
                "id": _tool_id(),
                "name": call.name,
                "input": partial_arguments(call.arguments)
                if call.truncated
                else json.loads(call.arguments),
            }
        )
    return blocks


def stop_reason(gen: Generation, stops: list[str], called: bool) -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` (a cut-off call is still max_tokens)."""
    if gen.finish_reason == "length":
        return "max_tokens", None
    if called:
        return "tool_use", None
    if isinstance(gen.matched_stop, str) and gen.matched_stop in stops:
        return "stop_sequence", gen.matched_stop
    return "end_turn", None


# --- handlers --------------------------------------------------------------------------------


async def create_message(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    body = await read_json(request)
    if not state.policy.serves(_model_field(body)):
        return await _elsewhere(request, state, body, "/messages")
    chat = parse_request(body, state.policy.model_id, state.policy.tool_parser)
    state.policy.note_dropped_tools(request[LOG_FIELDS], chat.dropped_tools)
    options = sampling_options(body)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise GatewayError(400, "stream: must be true or false", param="stream")
    episode = await Episode.of(request, state, body)
    request[LOG_FIELDS].update(model=chat.model, route="local")

    prompt_ids = render_prompt(state, chat, episode.history(request), request[LOG_FIELDS])
    extra: dict[str, Any] = dict(chat.grammar)
    if "top_k" in options:
        extra["top_k"] = options["top_k"]
    sampling = state.policy.sampling(
        len(prompt_ids),
        max_tokens=options["max_tokens"],
        temperature=options.get("temperature"),
        top_p=options.get("top_p"),
        stop=options.get("stop"),
        extra=extra,
    )
    if stream:
        return await _stream(request, state, chat, prompt_ids, sampling, episode)
    gen = await state.policy.generate(prompt_ids, sampling, sticky=episode.sticky)
    # A recorded completion's id is its handle for a reward (POST /rl/sessions/{id}/reward).
    completion_id = await episode.record(request, state, gen)  # (an abort is counted, not kept)
    check_not_aborted(gen)
    blocks = reply_blocks(state, chat, gen)
    reason, sequence = stop_reason(
        gen, sampling.get("stop") or [], any(b["type"] == "tool_use" for b in blocks)
    )
    message_id = completion_id or _message_id()
    episode.answered(request, message_id)
    return web.json_response(
        {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": chat.model,
            "content": blocks,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": _usage(len(prompt_ids), len(gen.output_ids)),
        }
    )


async def count_tokens(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    body = await read_json(request)
    if not state.policy.serves(_model_field(body)):
        return await _elsewhere(request, state, body, "/messages/count_tokens")
    chat = parse_request(body, state.policy.model_id, state.policy.tool_parser)
    request[LOG_FIELDS].update(model=chat.model, route="local")
    await Episode.of(request, state, body, admit=False)  # for the log line
    prompt_ids = render_prompt(state, chat, log_fields=request[LOG_FIELDS])
    return web.json_response({"input_tokens": len(prompt_ids)})


def _model_field(body: dict[str, Any]) -> str | None:
    model = body.get("model")
    return model if isinstance(model, str) else None


async def _elsewhere(
    request: web.Request, state: GatewayState, body: dict[str, Any], path: str
) -> web.StreamResponse:
    """A model id that is not the policy: the upstream channel, or a 404 naming both ids."""
    model = body.get("model")
    request[LOG_FIELDS].update(model=model)
    if state.upstream is None:
        raise GatewayError(
            404,
            f"model {model!r} is not served here: this gateway serves the policy "
            f"{state.policy.model_id!r} and has no upstream channel (api_gateway) configured",
            param="model",
            code="model_not_found",
        )
    response: web.StreamResponse = await state.upstream.forward(request, body, path)
    return response


# --- streaming -------------------------------------------------------------------------------


class EventStream:
    """Writes Anthropic's named SSE events and keeps track of the open content block."""

    def __init__(self, response: web.StreamResponse) -> None:
        self.response = response
        self.index = -1
        self.open: str | None = None  # "text" | "tool_use"
        self.tool_calls = 0

    async def send(self, event: str, data: dict[str, Any]) -> None:
        await self.response.write(sse_event({"type": event, **data}, event))

    async def text(self, delta: str) -> None:
        if not delta:
            return
        if self.open != "text":
            await self.start({"type": "text", "text": ""})
        await self.send(
            "content_block_delta",
            {"index": self.index, "delta": {"type": "text_delta", "text": delta}},
        )

    async def start(self, block: dict[str, Any]) -> None:
        await self.stop()
        self.index += 1
        self.open = block["type"]
        if block["type"] == "tool_use":
            self.tool_calls += 1
        await self.send("content_block_start", {"index": self.index, "content_block": block})

    async def tool_input(self, partial_json: str) -> None:
        if partial_json:
            await self.send(
                "content_block_delta",
                {
                    "index": self.index,
                    "delta": {"type": "input_json_delta", "partial_json": partial_json},
                },
            )

    async def tool_call(self, name: str, arguments: str) -> None:
        await self.start({"type": "tool_use", "id": _tool_id(), "name": name, "input": {}})
        await self.tool_input(arguments)
        await self.stop()

    async def stop(self) -> None:
        if self.open is not None:
            await self.send("content_block_stop", {"index": self.index})
            self.open = None

    async def finish(self) -> None:
        """Close the last block; a reply with no block at all still gets an empty text block."""
        if self.index < 0:
            await self.start({"type": "text", "text": ""})
        await self.stop()


async def _stream(
    request: web.Request,
    state: GatewayState,
    chat: ChatRequest,
    prompt_ids: list[int],
    sampling: dict[str, Any],
    episode: Episode,
) -> web.StreamResponse:
    """Serve a ``stream: true`` request. The first engine chunk is awaited before the headers go
    out, so an engine that is down is still an HTTP error rather than an error event."""
    stops: list[str] = sampling.get("stop") or []
    generations = cast(
        "AsyncGenerator[Generation, None]",
        state.policy.stream(prompt_ids, sampling, sticky=episode.sticky),
    )
    async with aclosing(generations) as gens:
        first = await anext(gens, None)
        if first is None or first.finish_reason == "abort":  # still time for an HTTP error
            if first is not None:
                await episode.record(request, state, first)
            check_not_aborted(first)
        response = EventStreamResponse()
        await response.prepare(request)
        events = EventStream(response)
        try:
            start = _message_start(chat, prompt_ids)
            episode.answered(request, start["id"])
            await events.send("message_start", {"message": start})
            await events.send("ping", {})
            last = await _stream_blocks(state, chat, events, _chain(first, gens), stops)
            if last is not None:
                await episode.record(request, state, last)
            last = check_not_aborted(last)
            reason, sequence = stop_reason(last, stops, events.tool_calls > 0)
            await events.send(
                "message_delta",
                {
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": _usage(len(prompt_ids), len(last.output_ids)),
                },
            )
            await events.send("message_stop", {})
        except GatewayError as err:  # the status line is gone: say it as an error event
            await events.send(
                "error", {"error": anthropic_error_body(err.status, err.message)["error"]}
            )
        except ConnectionResetError:  # the client left; closing the generator aborts the engine
            return response
    await response.write_eof()
    return response


def _message_start(chat: ChatRequest, prompt_ids: list[int]) -> dict[str, Any]:
    return {
        "id": _message_id(),
        "type": "message",
        "role": "assistant",
        "model": chat.model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": _usage(len(prompt_ids), 0),
    }


async def _chain(
    first: Generation | None, rest: AsyncIterator[Generation]
) -> AsyncIterator[Generation]:
    if first is not None:
        yield first
    async for gen in rest:
        yield gen


async def _stream_blocks(
    state: GatewayState,
    chat: ChatRequest,
    events: EventStream,
    gens: AsyncIterator[Generation],
    stops: list[str],
) -> Generation | None:
    """Turn cumulative generations into content-block events; returns the last generation.

    Text and tool calls come from the shared :class:`OutputStream`; a forced call is also read
    while it is written (:class:`ForcedCallReader`), so its ``tool_use`` block opens as soon as
    the name is known and its arguments stream as they are generated; one the token limit cut
    ends with its arguments as written (its name, if that was cut too, as
    :func:`cut_forced_call` reads it), as the non-streamed reply says it.
    """
    output = OutputStream(chat.plan, state.policy.tool_parser, stops)
    forced = ForcedCallReader(chat.plan.suffix) if chat.plan.forced else None
    last: Generation | None = None
    async for gen in gens:
        last = gen
        if forced is not None:
            cut = None
            if gen.finished and gen.finish_reason == "length":
                cut = cut_forced_call(chat.plan, gen.text)
            name, partial = forced.update(gen.text, gen.finished, cut)
            if name is not None:
                await events.start(
                    {"type": "tool_use", "id": _tool_id(), "name": name, "input": {}}
                )
            await events.tool_input(partial)
        for event in output.step(gen):
            if forced is not None and forced.name is not None:
                continue  # the forced call, already said as it was written
            if event.kind == "tool_call" and event.call is not None:
                await events.tool_call(event.call.name, event.call.arguments)
            else:
                await events.text(event.text)
    await events.finish()
    return last


def add_routes(app: web.Application, prefixes: tuple[str, ...]) -> None:
    """Register this protocol's routes under each prefix."""
    for prefix in prefixes:
        app.router.add_post(f"{prefix}/messages", create_message)
        app.router.add_post(f"{prefix}/messages/count_tokens", count_tokens)
