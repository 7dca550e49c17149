"""Anthropic Messages: ``POST {prefix}/messages`` and ``POST {prefix}/messages/count_tokens``.

A request is turned into the OpenAI-shaped chat the policy's template renders (``tool_use`` blocks
become ``tool_calls`` with the same ids, ``tool_result`` blocks become ``tool`` messages), served by
the policy, and answered in Anthropic's shapes. Streams carry the whole named-event sequence with
``usage`` in ``message_start`` and ``message_delta``: without them the SDK's stream accumulator
breaks and Claude Code quietly repeats the call without streaming, which would record the episode
twice. Real clients send much the policy cannot use (``thinking``, ``context_management``,
``metadata``, ``anthropic-beta``...): it is ignored, not refused; what would change the answer
and cannot be honoured (images) is a 400 that says so.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, TypeGuard, cast

from aiohttp import web

from areal.core.tool_calls import ToolCall, new_call_id
from areal.gateway.episodes import Episode, check_not_aborted
from areal.gateway.errors import GatewayError, anthropic_error_body
from areal.gateway.gateway_state import GatewayState, state_of
from areal.gateway.policy import Generation, TextDeltas
from areal.gateway.request_body import read_json
from areal.gateway.request_log import LOG_FIELDS

_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
_DROPPED_BLOCKS = frozenset({"thinking", "redacted_thinking"})
_CHOICES = ("auto", "any", "tool", "none")


# --- the request -----------------------------------------------------------------------------


@dataclass
class ChatRequest:
    """An Anthropic request as the policy sees it."""

    model: str
    messages: list[dict[str, Any]]  # OpenAI-shaped
    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI function specs
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)  # tool name -> input_schema
    choice: str = "auto"  # auto | any | tool | none
    forced_name: str | None = None  # with choice "tool"
    prefill: str = ""  # a trailing assistant turn the reply continues
    json_schema: dict[str, Any] | None = None  # output_config.format

    @property
    def forced(self) -> bool:
        return self.choice in ("any", "tool") and bool(self.tools)

    @property
    def parses_tools(self) -> bool:
        return bool(self.tools) and self.choice != "none"


def parse_request(body: dict[str, Any], policy_id: str) -> ChatRequest:
    """Validate what the policy needs; everything else in ``body`` is ignored."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise GatewayError(400, "model: must be a string", param="model")
    messages = convert_messages(body.get("messages"))
    system = system_text(body.get("system"))
    if system:  # an empty system prompt is none, as in Anthropic's API
        messages.insert(0, {"role": "system", "content": system})
    prefill = ""
    if messages and messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls"):
        prefill = messages.pop()["content"]
    if not messages:
        raise GatewayError(
            400, "messages: the conversation has nothing to answer", param="messages"
        )
    tools, schemas = convert_tools(body.get("tools"))
    choice, forced_name = tool_choice(body.get("tool_choice"), schemas)
    request = ChatRequest(
        model=model or policy_id,
        messages=messages,
        tools=tools,
        schemas=schemas,
        choice=choice,
        forced_name=forced_name,
        prefill=prefill,
        json_schema=output_schema(body),
    )
    if request.forced and request.json_schema is not None:
        raise GatewayError(
            400,
            "output_config.format cannot be combined with tool_choice any/tool: the reply is "
            "either a forced tool call or JSON for the schema",
            param="output_config",
        )
    return request


def system_text(value: Any) -> str | None:
    """``system`` as a string or a list of text blocks (``cache_control`` and the like ignored)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for i, block in enumerate(value):
            if not isinstance(block, dict) or block.get("type") != "text":
                raise GatewayError(400, f"system.{i}: must be a text block", param="system")
            texts.append(_text_of(block, f"system.{i}"))
        return "\n".join(texts)
    raise GatewayError(400, "system: must be a string or a list of text blocks", param="system")


def convert_messages(raw: Any) -> list[dict[str, Any]]:
    """Anthropic turns -> OpenAI-shaped messages, keeping the order of text and tool results."""
    if not isinstance(raw, list) or not raw:
        raise GatewayError(400, "messages: must be a non-empty list", param="messages")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(raw):
        where = f"messages.{i}"
        if not isinstance(message, dict):
            raise GatewayError(400, f"{where}: must be an object", param="messages")
        role = message.get("role")
        content = message.get("content")
        if role == "assistant":
            out.append(_assistant(content, where))
        elif role in ("user", "system"):  # a system turn mid-conversation is accepted as one
            out.extend(_user(content, where, role))
        else:
            raise GatewayError(
                400, f"{where}.role: must be 'user' or 'assistant', got {role!r}", param="messages"
            )
    return out


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise GatewayError(
            400, f"{where}.content: must be a string or a list of content blocks", param="messages"
        )
    blocks = []
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise GatewayError(
                400, f"{where}.content.{j}: must be a block with a 'type'", param="messages"
            )
        kind = block["type"]
        if kind in ("image", "document"):
            raise GatewayError(
                400,
                f"{where}.content.{j}: {kind}s are not supported by the policy",
                param="messages",
            )
        if kind not in _DROPPED_BLOCKS:
            blocks.append(block)
    return blocks


def _assistant(content: Any, where: str) -> dict[str, Any]:
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(_blocks(content, where)):
        at = f"{where}.content.{j}"
        if block["type"] == "text":
            text.append(_text_of(block, at))
        elif block["type"] == "tool_use":
            calls.append(_tool_call(block, at))
        else:
            raise GatewayError(
                400, f"{at}: block type {block['type']!r} is not supported here", param="messages"
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_call(block: dict[str, Any], at: str) -> dict[str, Any]:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
    if not isinstance(call_id, str) or not isinstance(name, str):
        raise GatewayError(400, f"{at}: tool_use needs a string 'id' and 'name'", param="messages")
    if not isinstance(arguments, dict):
        raise GatewayError(400, f"{at}.input: must be an object", param="messages")
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def _user(content: Any, where: str, role: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    text: list[str] = []

    def flush() -> None:
        if text:
            out.append({"role": role, "content": "".join(text)})
            text.clear()

    blocks = _blocks(content, where)
    for j, block in enumerate(blocks):
        at = f"{where}.content.{j}"
        if block["type"] == "text":
            text.append(_text_of(block, at))
        elif block["type"] == "tool_result" and role == "user":
            flush()
            out.append(_tool_result(block, at))
        else:
            raise GatewayError(
                400, f"{at}: block type {block['type']!r} is not supported here", param="messages"
            )
    flush()
    if not blocks:  # an empty turn still takes its place in the conversation
        out.append({"role": role, "content": ""})
    return out


def _tool_result(block: dict[str, Any], at: str) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        raise GatewayError(400, f"{at}: tool_result needs a string 'tool_use_id'", param="messages")
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        parts = []
        for k, part in enumerate(_blocks(content, at)):
            if part["type"] != "text":
                raise GatewayError(
                    400, f"{at}.content.{k}: only text blocks go in a tool_result", param="messages"
                )
            parts.append(_text_of(part, f"{at}.content.{k}"))
        text = "\n".join(parts)
    if block.get("is_error") is True:
        text = "Error: " + text
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _text_of(block: dict[str, Any], at: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise GatewayError(400, f"{at}.text: must be a string", param="messages")
    return text


def convert_tools(raw: Any) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Custom tools -> OpenAI function specs. Anthropic's server tools (``web_search_...``) have
    no schema the policy could fill, so they are left out."""
    if raw is None:
        return [], {}
    if not isinstance(raw, list):
        raise GatewayError(400, "tools: must be a list", param="tools")
    specs: list[dict[str, Any]] = []
    schemas: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(raw):
        if not isinstance(tool, dict):
            raise GatewayError(400, f"tools.{i}: must be an object", param="tools")
        if tool.get("type") not in (None, "custom") and "input_schema" not in tool:
            continue
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            raise GatewayError(
                400, f"tools.{i}.name: must match {_TOOL_NAME.pattern}, got {name!r}", param="tools"
            )
        if name in schemas:
            raise GatewayError(400, f"tools.{i}.name: {name!r} is given twice", param="tools")
        schema = _check_schema(schema, f"tools.{i}.input_schema")
        description = tool.get("description")
        if description is not None and not isinstance(description, str):
            raise GatewayError(400, f"tools.{i}.description: must be a string", param="tools")
        function: dict[str, Any] = {"name": name}
        if description:
            function["description"] = description
        function["parameters"] = schema
        specs.append({"type": "function", "function": function})
        schemas[name] = schema
    return specs, schemas


def _check_schema(schema: Any, at: str) -> dict[str, Any]:
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise GatewayError(400, f"{at}: must be a JSON schema with type 'object'", param="tools")
    properties = schema.get("properties", {})
    if not isinstance(properties, dict) or not all(
        isinstance(p, dict) for p in properties.values()
    ):
        raise GatewayError(400, f"{at}.properties: must map names to schemas", param="tools")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise GatewayError(400, f"{at}.required: must be a list of property names", param="tools")
    return schema


def tool_choice(raw: Any, schemas: dict[str, dict[str, Any]]) -> tuple[str, str | None]:
    if raw is None:
        return "auto", None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in _CHOICES:
        raise GatewayError(
            400, f"tool_choice.type: must be one of {', '.join(_CHOICES)}", param="tool_choice"
        )
    if kind in ("any", "tool") and not schemas:
        raise GatewayError(
            400, f"tool_choice {kind!r} needs at least one tool", param="tool_choice"
        )
    if kind != "tool":
        return kind, None
    name = raw.get("name")
    if name not in schemas:
        raise GatewayError(
            400,
            f"tool_choice.name: {name!r} is not one of the tools ({', '.join(schemas)})",
            param="tool_choice",
        )
    return kind, name


def output_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """``output_config.format`` (or the older beta ``output_format``) of type json_schema."""
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else None
    if fmt is None:
        fmt = body.get("output_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise GatewayError(
            400,
            "output_config.format: only {type: json_schema, schema} is supported",
            param="output_config",
        )
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise GatewayError(
            400, "output_config.format.schema: must be an object", param="output_config"
        )
    return schema


def sampling_options(body: dict[str, Any]) -> dict[str, Any]:
    """``max_tokens`` (required by the protocol), temperature, top_p, top_k, stop_sequences."""
    max_tokens = body.get("max_tokens")
    if not _is_int(max_tokens) or max_tokens < 1:
        raise GatewayError(400, "max_tokens: a positive integer is required", param="max_tokens")
    options: dict[str, Any] = {"max_tokens": max_tokens}
    for key, low, high in (("temperature", 0.0, None), ("top_p", 0.0, 1.0)):
        value = body.get(key)
        if value is None:
            continue
        if not _is_number(value) or value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"of at least {low}"
            raise GatewayError(400, f"{key}: must be a number {bound}", param=key)
        options[key] = float(value)
    if options.get("top_p") == 0.0:
        raise GatewayError(400, "top_p: must be greater than 0", param="top_p")
    top_k = body.get("top_k")
    if top_k is not None:
        if not _is_int(top_k) or top_k < 1:
            raise GatewayError(400, "top_k: must be a positive integer", param="top_k")
        options["top_k"] = top_k
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise GatewayError(
                400, "stop_sequences: must be a list of non-empty strings", param="stop_sequences"
            )
        options["stop"] = list(stops)
    return options


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    """A finite JSON number (``1e999`` parses as infinity, which no sampler takes)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# --- the prompt ------------------------------------------------------------------------------


def forced_call_schema(chat: ChatRequest) -> dict[str, Any]:
    """The JSON a forced call must be: ``{"name": <a tool>, "arguments": <its input>}``."""
    names = [chat.forced_name] if chat.forced_name is not None else list(chat.schemas)

    def one(name: str) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": chat.schemas[name]},
            "required": ["name", "arguments"],
        }

    return one(names[0]) if len(names) == 1 else {"anyOf": [one(n) for n in names]}


def render_prompt(
    state: GatewayState, chat: ChatRequest, history: list[int] | None = None
) -> list[int]:
    """The prompt ids: the chat, the prefill, and for a forced call the parser's opening tag
    (``history``: the episode's tokens so far, see :meth:`PolicyService.render`)."""
    prefix = chat.prefill
    if chat.forced:
        prefix += state.policy.tool_parser.forced_prefix()
    tools = chat.tools if chat.choice != "none" else None
    return state.policy.render(chat.messages, tools, prefix, history=history)


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


def parse_forced(text: str) -> ToolCall | None:
    """The call a forced generation wrote, or None if it was cut short."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments")
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False), _tool_id())


def reply_blocks(state: GatewayState, chat: ChatRequest, gen: Generation) -> list[dict[str, Any]]:
    """The content blocks of a finished generation."""
    text, calls = gen.text, []
    if chat.forced:
        call = parse_forced(gen.text)
        if call is not None:
            text, calls = "", [call]
    elif chat.parses_tools:
        parsed = state.policy.tool_parser.parse(gen.text)
        text, calls = parsed.content, parsed.tool_calls
    blocks: list[dict[str, Any]] = []
    if text or not calls:
        blocks.append({"type": "text", "text": text})
    for call in calls:
        blocks.append(
            {
                "type": "tool_use",
                "id": _tool_id(),
                "name": call.name,
                "input": json.loads(call.arguments),
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
    chat = parse_request(body, state.policy.model_id)
    options = sampling_options(body)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise GatewayError(400, "stream: must be true or false", param="stream")
    episode = Episode.of(request, state, body)
    request[LOG_FIELDS].update(model=chat.model, route="local")

    prompt_ids = render_prompt(state, chat, episode.history(request))
    extra: dict[str, Any] = {}
    if "top_k" in options:
        extra["top_k"] = options["top_k"]
    schema = forced_call_schema(chat) if chat.forced else chat.json_schema
    if schema is not None:
        extra["json_schema"] = json.dumps(schema)
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
    return web.json_response(
        {
            "id": completion_id or _message_id(),
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
    chat = parse_request(body, state.policy.model_id)
    request[LOG_FIELDS].update(model=chat.model, route="local")
    Episode.of(request, state, body)  # for the log line
    return web.json_response({"input_tokens": len(render_prompt(state, chat))})


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
        payload = json.dumps({"type": event, **data}, ensure_ascii=False)
        await self.response.write(f"event: {event}\ndata: {payload}\n\n".encode())

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


class ForcedCallStream:
    """Streams a forced call's ``arguments`` as ``input_json_delta`` while it is generated.

    The constrained output is ``{"name": "...", "arguments": {...}}`` with the name first (the
    schema fixes the order); once the name is complete the tool_use block opens, and the text
    after ``"arguments":`` goes out as it comes, holding back what may be the outer ``}``.
    """

    _HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')
    _TAIL = re.compile(r"\s*\}?\s*$")

    def __init__(self) -> None:
        self.name: str | None = None
        self.start = 0
        self.sent = 0

    def update(self, text: str, final: bool) -> tuple[str | None, str]:
        """(the name, when it has just become known; the new part of the arguments)."""
        opened = None
        if self.name is None:
            match = self._HEAD.match(text)
            if match is None:
                return None, ""
            self.name = opened = json.loads(match.group(1))
            self.start = self.sent = match.end()
        body = text[self.start :]
        if final:
            stable = self.start + len(re.sub(r"\s*\}\s*$", "", body, count=1))
        else:
            tail = self._TAIL.search(body)
            stable = self.start + (tail.start() if tail else len(body))
        delta = text[self.sent : stable] if stable > self.sent else ""
        self.sent = max(self.sent, stable)
        return opened, delta


def _held_back(text: str, stops: list[str]) -> int:
    """How much of the end of ``text`` may still grow into a stop sequence (held until sure)."""
    keep = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), keep, -1):
            if text.endswith(stop[:n]):
                keep = n
                break
    return keep


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
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        events = EventStream(response)
        try:
            await events.send("message_start", {"message": _message_start(chat, prompt_ids)})
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
    """Turn cumulative generations into content-block events; returns the last generation."""
    deltas = TextDeltas()
    forced = ForcedCallStream() if chat.forced else None
    calls = state.policy.tool_parser.new_stream() if chat.parses_tools and not chat.forced else None
    last: Generation | None = None
    async for gen in gens:
        last = gen
        final = gen.finished
        if forced is not None:
            name, partial = forced.update(gen.text if final else gen.text.rstrip("\ufffd"), final)
            if name is not None:
                await events.start(
                    {"type": "tool_use", "id": _tool_id(), "name": name, "input": {}}
                )
            await events.tool_input(partial)
            continue
        text = gen.text if final else gen.text[: len(gen.text) - _held_back(gen.text, stops)]
        delta = deltas.delta(text, final=final)
        if calls is None:
            await events.text(delta)
            continue
        for event in calls.feed(delta) + (calls.finish() if final else []):
            if event.kind == "text":
                await events.text(event.text)
            elif event.call is not None:
                await events.tool_call(event.call.name, event.call.arguments)
    if forced is not None and forced.name is None and last is not None:
        await events.text(last.text)  # cut short before the call's name was complete
    await events.finish()
    return last


def add_routes(app: web.Application, prefixes: tuple[str, ...]) -> None:
    """Register this protocol's routes under each prefix."""
    for prefix in prefixes:
        app.router.add_post(f"{prefix}/messages", create_message)
        app.router.add_post(f"{prefix}/messages/count_tokens", count_tokens)
