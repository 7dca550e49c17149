"""OpenAI Responses API (``POST /v1/responses``), stream and not, with function tools.

Agents built on ``client.responses.create`` (the OpenAI Agents SDK, Codex-style tools) send a list
of input items instead of chat messages. They are turned into the OpenAI-shaped chat the policy
renders, so a Responses call and a Chat Completions call of the same conversation give the same
prompt tokens. The gateway keeps no response store: ``previous_response_id`` is refused with a
message that says to send the whole input, which is what every stateless client does anyway.

Tool calls come from the policy's tool-call parser; a forced call (``tool_choice`` "required" or a
named function) opens the call in the prompt and constrains the rest with a JSON schema, so its
arguments always parse and satisfy the tool's parameters.
"""

from __future__ import annotations

import contextlib
import json
import math
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

from aiohttp import web

from areal.core.tool_calls import StreamEvent, ToolCall, ToolCallParser
from areal.gateway.chat_messages import (
    JSON_OBJECT_SCHEMA,
    ROLE_ALIASES,
    OutputStream,
    ToolPlan,
    allowed_tools_plan,
    arguments_text,
    bad,
    content_text,
    function_tool,
    grammar_params,
    hosted_tool_kind,
    openai_tool_choice,
    plan_tools,
    split_output,
    tool_names,
    type_name,
)
from areal.gateway.episodes import Episode
from areal.gateway.errors import GatewayError
from areal.gateway.gateway_state import GatewayState, state_of
from areal.gateway.policy import Generation
from areal.gateway.request_body import read_json
from areal.gateway.request_log import LOG_FIELDS
from areal.gateway.sse import EventStreamResponse, sse_event

ROUTE = "/responses"
_ROLES = ("system", "user", "assistant")
_SKIPPED_ITEMS = {"reasoning"}  # the policy's own reasoning is not re-rendered


# --- the request --------------------------------------------------------------------------------


@dataclass
class ResponsesRequest:
    """A validated ``/responses`` body: what to render, how to sample, what to echo back."""

    messages: list[dict[str, Any]]
    plan: ToolPlan
    text_schema: str | None  # text.format json_schema / json_object, as SGLang's string
    max_output_tokens: int | None
    temperature: float | None
    top_p: float | None
    stream: bool
    echo: dict[str, Any] = field(default_factory=dict)  # request fields the response repeats
    dropped_tools: list[str] = field(default_factory=list)  # hosted tools left out, by type

    @property
    def grammar(self) -> dict[str, str]:
        """The engine's grammar: a forced call's, else the text format's."""
        return grammar_params(self.plan, self.text_schema)

    @property
    def parse_calls(self) -> bool:
        """Read tool calls out of the output (never out of JSON the text format asked for)."""
        return self.plan.parse_calls and (self.plan.forced or self.text_schema is None)


def parse_request(body: dict[str, Any], parser: ToolCallParser) -> ResponsesRequest:
    """Check a body and turn it into a :class:`ResponsesRequest`; 400s say what to fix."""
    for key, store in (("previous_response_id", "response"), ("conversation", "conversation")):
        if body.get(key) is not None:
            raise GatewayError(
                400,
                f"{key} is not supported: send the full input (the gateway keeps no {store} store)",
                param=key,
                code="invalid_request_error",
            )
    if body.get("background"):
        raise bad("background", "background responses are not supported; leave it unset")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("model", f"must be a string, got {type_name(model)}")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad("instructions", f"must be a string, got {type_name(instructions)}")
    messages = input_messages(body.get("input"))
    if instructions:
        messages.insert(0, {"role": "system", "content": instructions})
    dropped: list[str] = []
    tools, echo_tools = responses_tools(body.get("tools"), dropped)
    choice = body.get("tool_choice")
    text_schema, text_echo = text_format(body.get("text"))
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad("stream", f"must be a boolean, got {type_name(stream)}")
    metadata, user, cache_key = body.get("metadata"), body.get("user"), body.get("prompt_cache_key")
    return ResponsesRequest(
        messages=messages,
        plan=tool_plan(choice, tools, parser),
        text_schema=text_schema,
        max_output_tokens=_number(body, "max_output_tokens", integer=True, low=1),
        temperature=_number(body, "temperature", low=0, high=2),
        top_p=_number(body, "top_p", low=0, high=1),
        stream=bool(stream),
        echo={
            "instructions": instructions,
            "metadata": metadata if isinstance(metadata, dict) else {},
            "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
            "text": text_echo,
            "tool_choice": choice if choice is not None else "auto",
            "tools": echo_tools,
            "truncation": "auto" if body.get("truncation") == "auto" else "disabled",
            "user": user if isinstance(user, str) else None,
            "prompt_cache_key": cache_key if isinstance(cache_key, str) else None,
        },
        dropped_tools=dropped,
    )


def _number(
    body: dict[str, Any],
    key: str,
    *,
    integer: bool = False,
    low: float | None = None,
    high: float | None = None,
) -> Any:
    value = body.get(key)
    if value is None:
        return None
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if integer:
        ok = ok and float(value).is_integer()
    if not ok or (low is not None and value < low) or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
        kind = "an integer" if integer else "a number"
        raise bad(key, f"must be {kind} {bounds}, got {json.dumps(value)[:100]}")
    return int(value) if integer else float(value)


def input_messages(items: Any) -> list[dict[str, Any]]:
    """Responses ``input`` (a string or a list of items) → policy messages.

    ``function_call`` items join the assistant turn before them: the text and the calls the model
    produced together are one assistant message, as the chat template renders them, so the next
    prompt extends the last one. ``function_call_output`` items become tool messages;
    ``reasoning`` items are dropped (the policy's chat template does not re-render them).
    """
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad("input", "must be a string or a non-empty list of input items")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad(where, f"an input item must be an object, got {type_name(item)}")
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": ""}
                messages.append(last)
            last.setdefault("tool_calls", []).append(
                {
                    "id": _call_id(item, where),
                    "type": "function",
                    "function": {
                        "name": _name(item, where),
                        "arguments": arguments_text(item.get("arguments"), f"{where}.arguments"),
                    },
                }
            )
        elif kind == "function_call_output":
            content = content_text(item.get("output"), f"{where}.output")
            messages.append(
                {"role": "tool", "tool_call_id": _call_id(item, where), "content": content}
            )
        elif kind not in _SKIPPED_ITEMS:
            raise bad(
                f"{where}.type",
                f"input items of type {kind!r} are not supported; send message, function_call "
                "and function_call_output items",
            )
    if not messages:
        raise bad("input", "has no message for the policy to answer")
    return messages


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    role = ROLE_ALIASES.get(role, role) if isinstance(role, str) else role
    if role not in _ROLES:
        raise bad(
            f"{where}.role",
            f"must be one of user, assistant, system, developer; got {json.dumps(item.get('role'))}",
        )
    return {"role": role, "content": content_text(item.get("content"), f"{where}.content")}


def _call_id(item: dict[str, Any], where: str) -> str:
    value = item.get("call_id")
    if not isinstance(value, str) or not value:
        raise bad(f"{where}.call_id", f"must be a non-empty string, got {type_name(value)}")
    return value


def _name(item: dict[str, Any], where: str) -> str:
    value = item.get("name")
    if not isinstance(value, str) or not value:
        raise bad(f"{where}.name", f"must be a non-empty string, got {type_name(value)}")
    return value


def responses_tools(
    tools: Any, dropped: list[str] | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Responses function tools → (policy function specs, the tools the response echoes).
    Hosted tools (``web_search``, ``namespace``...) are left out, their types added to
    ``dropped`` (:func:`~areal.gateway.chat_messages.hosted_tool_kind`)."""
    if tools is None:
        return [], []
    if not isinstance(tools, list):
        raise bad("tools", f"must be a list of tools, got {type_name(tools)}")
    specs: list[dict[str, Any]] = []
    echoed: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise bad(where, f"a tool must be an object, got {type_name(tool)}")
        if tool.get("type") != "function":
            kind = hosted_tool_kind(tool, where)
            if dropped is not None:
                dropped.append(kind)
            continue
        spec = function_tool(
            tool.get("name"), tool.get("description"), tool.get("parameters"), where
        )
        fn = spec["function"]
        if fn["name"] in tool_names(specs):
            raise bad(f"{where}.name", f"tool {fn['name']!r} is defined twice")
        specs.append(spec)
        strict = tool.get("strict")
        echoed.append(
            {
                "type": "function",
                "name": fn["name"],
                "description": fn.get("description"),
                "parameters": fn["parameters"],
                "strict": strict if isinstance(strict, bool) else None,
            }
        )
    return specs, echoed


def tool_plan(choice: Any, tools: list[dict[str, Any]], parser: ToolCallParser) -> ToolPlan:
    """Responses ``tool_choice`` → how to run the tools.

    "none" | "auto" | "required" | ``{"type": "function", "name"}`` mean what they mean in Chat
    Completions; ``{"type": "allowed_tools", "mode", "tools"}`` keeps every tool in the prompt
    (the same prompt as the other turns) and, in "required" mode, forces a call of the listed ones.
    """
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        return allowed_tools_plan(choice, tools, parser, "tool_choice")
    if isinstance(choice, dict) and choice.get("type", "function") != "function":
        raise bad(
            "tool_choice.type",
            f"tool choice type {choice.get('type')!r} is not supported; use none, auto, "
            'required, {"type": "function", "name": ...} or allowed_tools',
        )
    return plan_tools(tools, openai_tool_choice(choice), parser)


def text_format(text: Any) -> tuple[str | None, dict[str, Any]]:
    """``text.format`` → (the json_schema constraint as SGLang's string, or None; what to echo)."""
    plain: dict[str, Any] = {"format": {"type": "text"}}
    if text is None:
        return None, plain
    if not isinstance(text, dict):
        raise bad("text", f"must be an object, got {type_name(text)}")
    fmt = text.get("format")
    if fmt is None:
        return None, {**text, **plain}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None, text
    if kind == "json_object":
        return JSON_OBJECT_SCHEMA, text
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise bad(
                "text.format.schema", f"must be a JSON schema object, got {type_name(schema)}"
            )
        return json.dumps(schema), text
    raise bad(
        "text.format.type",
        f"format type {kind!r} is not supported; use text, json_object or json_schema",
    )


# --- the response -------------------------------------------------------------------------------


def _id(prefix: str) -> str:
    return prefix + secrets.token_hex(16)


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": _id("msg_"),
        "status": status,
        "role": "assistant",
        "content": [text_part(text)],
    }


def call_item(call: ToolCall, status: str = "completed") -> dict[str, Any]:
    """A ``function_call`` item; a call the token limit cut is ``incomplete``, its arguments as
    far as they were written."""
    return {
        "type": "function_call",
        "id": _id("fc_"),
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": "incomplete" if call.truncated else status,
    }


def finish_status(gen: Generation) -> str:
    return "incomplete" if gen.finish_reason == "length" else "completed"


def usage(gen: Generation) -> dict[str, Any]:
    """Counted in tokens: the prompt the gateway sent, the output the engine returned."""
    prompt, output = len(gen.prompt_ids), len(gen.output_ids)
    cached = gen.meta.get("cached_tokens")
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached if isinstance(cached, int) else 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + output,
    }


@dataclass
class ResponseHead:
    """What every ``response`` object of one request shares."""

    req: ResponsesRequest
    model: str
    sampling: dict[str, Any]
    id: str = field(default_factory=lambda: _id("resp_"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def body(
        self,
        status: str,
        output: list[dict[str, Any]],
        gen: Generation | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The ``response`` object, with every field the SDK's ``Response`` model requires."""
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": int(time.time()) if status == "completed" else None,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete"
            else None,
            "model": self.model,
            "output": output,
            "usage": usage(gen) if gen is not None else None,
            "max_output_tokens": self.req.max_output_tokens,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "temperature": self.sampling.get("temperature", 1.0),
            "top_p": self.sampling.get("top_p", 1.0),
            **self.req.echo,
        }


def output_items(req: ResponsesRequest, gen: Generation, parser: ToolCallParser) -> list[dict]:
    """A finished generation → a message (unless it holds only calls) and the function calls."""
    status = finish_status(gen)
    if not req.parse_calls:
        return [message_item(gen.text, status)]
    text, calls = split_output(req.plan, parser, gen.text, gen.finish_reason == "length")
    items = [message_item(text, status)] if text or not calls else []
    return items + [call_item(c) for c in calls]


# --- the handler --------------------------------------------------------------------------------


async def create_response(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    body = await read_json(request)
    model = body.get("model")
    request[LOG_FIELDS]["model"] = model if isinstance(model, str) else None
    if isinstance(model, str) and not state.policy.serves(model):
        if state.upstream is not None:
            return await state.upstream.forward(request, body, ROUTE)
        raise GatewayError(
            404,
            f"the model {model!r} does not exist here: this gateway serves the policy "
            f"{state.policy.model_id!r} and has no upstream channel (api_gateway) for other models",
            param="model",
            code="model_not_found",
        )
    request[LOG_FIELDS].update(model=state.policy.model_id, route="local")
    parser = state.policy.tool_parser
    req = parse_request(body, parser)
    state.policy.note_dropped_tools(request[LOG_FIELDS], req.dropped_tools)
    # A session key's calls, or with --online a conversation's; a driver's hints bind no
    # Responses call.
    episode = await Episode.of(request, state, body, bind_hints=False)
    history = episode.history(request)
    prompt_ids = state.policy.render(
        req.messages,
        req.plan.tools,
        req.plan.prefix,
        history=history,
        log_fields=request[LOG_FIELDS],
    )
    sampling = state.policy.sampling(
        len(prompt_ids),
        max_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        extra=req.grammar or None,
    )
    sticky = episode.sticky or req.echo["prompt_cache_key"]
    head = ResponseHead(req, state.policy.model_id, sampling)
    episode.answered(request, head.id)
    if req.stream:
        return await _stream(request, state, head, prompt_ids, sticky, episode)
    gen = await state.policy.generate(prompt_ids, sampling, sticky=sticky)
    if gen.finish_reason == "abort":
        raise GatewayError(503, "the inference engine aborted the generation; retry the request")
    await episode.record(request, state, gen)
    return web.json_response(head.body(finish_status(gen), output_items(req, gen, parser), gen))


# --- streaming ----------------------------------------------------------------------------------


class _EventWriter:
    """Named SSE events (``event:`` and ``data:`` lines) with a running ``sequence_number``."""

    def __init__(self, response: web.StreamResponse) -> None:
        self.response = response
        self.sequence = 0

    async def send(self, kind: str, **data: Any) -> None:
        payload = {"type": kind, "sequence_number": self.sequence, **data}
        self.sequence += 1
        await self.response.write(sse_event(payload, kind))


class _OutputStream:
    """Output items built from the parser's events, each step said as the SDK's stream events."""

    def __init__(self, events: _EventWriter) -> None:
        self.events = events
        self.items: list[dict[str, Any]] = []
        self.message: dict[str, Any] | None = None  # the message being written, if any

    async def apply(self, events: list[StreamEvent]) -> None:
        for event in events:
            if event.kind == "tool_call" and event.call is not None:
                await self.tool_call(event.call)
            else:
                await self.text(event.text)

    async def text(self, delta: str) -> None:
        if not delta:
            return
        message = self.message or await self._open_message()
        message["content"][0]["text"] += delta
        await self.events.send(
            "response.output_text.delta",
            item_id=message["id"],
            output_index=len(self.items) - 1,
            content_index=0,
            delta=delta,
            logprobs=[],
        )

    async def tool_call(self, call: ToolCall) -> None:
        """A call is said whole: the parser knows a call only once its JSON is complete."""
        await self.close_message()
        item = call_item(call, status="in_progress")
        item["arguments"] = ""
        self.items.append(item)
        at = {"item_id": item["id"], "output_index": len(self.items) - 1}
        await self.events.send(
            "response.output_item.added", output_index=at["output_index"], item=item
        )
        await self.events.send("response.function_call_arguments.delta", delta=call.arguments, **at)
        await self.events.send(
            "response.function_call_arguments.done", name=call.name, arguments=call.arguments, **at
        )
        item.update(
            arguments=call.arguments, status="incomplete" if call.truncated else "completed"
        )
        await self.events.send(
            "response.output_item.done", output_index=at["output_index"], item=item
        )

    async def _open_message(self) -> dict[str, Any]:
        item = message_item("", status="in_progress")
        part = item["content"].pop()
        self.items.append(item)
        index = len(self.items) - 1
        await self.events.send("response.output_item.added", output_index=index, item=item)
        item["content"].append(part)
        await self.events.send(
            "response.content_part.added",
            item_id=item["id"],
            output_index=index,
            content_index=0,
            part=part,
        )
        self.message = item
        return item

    async def close_message(self, status: str = "completed") -> None:
        item, self.message = self.message, None
        if item is None:
            return
        part = item["content"][0]
        at = {"item_id": item["id"], "output_index": self.items.index(item), "content_index": 0}
        await self.events.send("response.output_text.done", text=part["text"], logprobs=[], **at)
        await self.events.send("response.content_part.done", part=part, **at)
        item["status"] = status
        await self.events.send(
            "response.output_item.done", output_index=at["output_index"], item=item
        )

    async def finish(self, status: str) -> None:
        if not self.items:  # always a message, so ``output_text`` is "" rather than missing
            await self._open_message()
        await self.close_message(status)


async def _stream(
    request: web.Request,
    state: GatewayState,
    head: ResponseHead,
    prompt_ids: list[int],
    sticky: str | None,
    episode: Episode,
) -> web.StreamResponse:
    """Stream the response: each text delta leaves as soon as the engine has produced it.

    The HTTP answer starts only once the engine has accepted the request, so what it refuses (a
    schema it cannot compile, an unreachable engine) is still a plain 4xx/5xx error. The stream
    ends with ``response.completed``, or ``response.incomplete`` when the output hit
    ``max_output_tokens`` (as the OpenAI API does); a failure after the stream started is said as
    ``response.failed``, since the HTTP status is already sent.
    """
    generations = cast(
        AsyncGenerator[Generation, None],
        state.policy.stream(prompt_ids, head.sampling, sticky=sticky),
    )
    async with contextlib.aclosing(generations):
        first = await anext(generations, None)
        response = EventStreamResponse()
        await response.prepare(request)
        events = _EventWriter(response)
        out = _OutputStream(events)
        try:
            await events.send("response.created", response=head.body("in_progress", []))
            await events.send("response.in_progress", response=head.body("in_progress", []))
            gen = await _relay(head.req, state, out, first, generations)
            status = finish_status(gen)
            await out.finish(status)
            await episode.record(request, state, gen)
            kind = "response.completed" if status == "completed" else "response.incomplete"
            await events.send(kind, response=head.body(status, out.items, gen))
        except GatewayError as err:
            error = {"code": "server_error", "message": err.message}
            with contextlib.suppress(ConnectionError):
                await events.send(
                    "response.failed", response=head.body("failed", out.items, error=error)
                )
        except ConnectionError:  # the client went away; closing the engine stream stops it
            return response
    with contextlib.suppress(ConnectionError):
        await response.write_eof()
    return response


async def _relay(
    req: ResponsesRequest,
    state: GatewayState,
    out: _OutputStream,
    first: Generation | None,
    rest: AsyncIterator[Generation],
) -> Generation:
    """Feed the engine's text to the output through the shared :class:`OutputStream` (which
    reads tool calls when the request does); returns the finished generation."""
    plan = req.plan if req.parse_calls else ToolPlan()
    output = OutputStream(plan, state.policy.tool_parser)
    gen = first
    while gen is not None:
        if gen.finished and gen.finish_reason == "abort":
            break
        await out.apply(output.step(gen))
        if gen.finished:
            break
        gen = await anext(rest, None)
    if gen is None or not gen.finished or gen.finish_reason == "abort":
        raise GatewayError(503, "the inference engine ended the generation early; retry")
    return gen


def add_routes(app: web.Application, prefixes: tuple[str, ...]) -> None:
    """``POST {prefix}/responses`` under each prefix."""
    for prefix in prefixes:
        app.router.add_post(f"{prefix}{ROUTE}", create_response)
