"""An Anthropic Messages request as the policy's chat: OpenAI-shaped messages, tools, sampling.

``tool_use`` blocks become ``tool_calls`` with the same ids, ``tool_result`` blocks become
``tool`` messages, custom tools become the policy's function tools and ``tool_choice`` a
:class:`~areal.gateway.chat_messages.ToolPlan` (any/tool: a forced call, as Chat Completions'
required/named choice). What would change the answer and cannot be honoured (images) is a 400
naming the field; fields the policy cannot use are ignored.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from areal.core.tool_calls import ToolCallParser
from areal.gateway.chat_messages import (
    ChoiceMode,
    ToolChoice,
    ToolPlan,
    arguments_text,
    function_tool,
    grammar_params,
    hosted_tool_kind,
    plan_tools,
    tool_names,
)
from areal.gateway.errors import GatewayError

_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
_DROPPED_BLOCKS = frozenset({"thinking", "redacted_thinking"})
_CHOICES: dict[str, ChoiceMode] = {
    "auto": "auto",
    "any": "required",
    "tool": "function",
    "none": "none",
}


# --- the request -----------------------------------------------------------------------------


@dataclass
class ChatRequest:
    """An Anthropic request as the policy sees it."""

    model: str
    messages: list[dict[str, Any]]  # OpenAI-shaped
    plan: ToolPlan = field(default_factory=ToolPlan)  # the tools, as every protocol runs them
    prefill: str = ""  # a trailing assistant turn the reply continues
    json_schema: dict[str, Any] | None = None  # output_config.format
    dropped_tools: list[str] = field(default_factory=list)  # server tools left out, by type

    @property
    def grammar(self) -> dict[str, str]:
        """The engine's grammar: a forced call's, else the output format's."""
        schema = None if self.json_schema is None else json.dumps(self.json_schema)
        return grammar_params(self.plan, schema)


def parse_request(body: dict[str, Any], policy_id: str, parser: ToolCallParser) -> ChatRequest:
    """Validate what the policy needs; everything else in ``body`` is ignored. ``parser`` (the
    policy's) opens a forced call in the prompt."""
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
    dropped: list[str] = []
    tools = convert_tools(body.get("tools"), dropped)
    choice = tool_choice(body.get("tool_choice"), tool_names(tools))
    request = ChatRequest(
        model=model or policy_id,
        messages=messages,
        plan=plan_tools(tools, choice, parser),
        prefill=prefill,
        json_schema=output_schema(body),
        dropped_tools=dropped,
    )
    if request.plan.forced and request.json_schema is not None:
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
        "function": {"name": name, "arguments": arguments_text(arguments, f"{at}.input")},
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


def convert_tools(raw: Any, dropped: list[str] | None = None) -> list[dict[str, Any]]:
    """Custom tools -> the policy's function tools. Anthropic's server and built-in tools
    (``web_search_...``, ``bash_...``) have no schema the policy could fill, so they are left
    out, their types added to ``dropped`` (:func:`~areal.gateway.chat_messages.hosted_tool_kind`)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise GatewayError(400, "tools: must be a list", param="tools")
    specs: list[dict[str, Any]] = []
    for i, tool in enumerate(raw):
        if not isinstance(tool, dict):
            raise GatewayError(400, f"tools.{i}: must be an object", param="tools")
        if tool.get("type") not in (None, "custom") and "input_schema" not in tool:
            kind = hosted_tool_kind(tool, f"tools.{i}")
            if dropped is not None:
                dropped.append(kind)
            continue
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            raise GatewayError(
                400, f"tools.{i}.name: must match {_TOOL_NAME.pattern}, got {name!r}", param="tools"
            )
        if name in tool_names(specs):
            raise GatewayError(400, f"tools.{i}.name: {name!r} is given twice", param="tools")
        schema = _check_schema(schema, f"tools.{i}.input_schema")
        description = tool.get("description")
        if description is not None and not isinstance(description, str):
            raise GatewayError(400, f"tools.{i}.description: must be a string", param="tools")
        specs.append(function_tool(name, description, schema, f"tools.{i}"))
    return specs


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


def tool_choice(raw: Any, names: list[str]) -> ToolChoice:
    """``tool_choice`` {"type": auto | any | tool | none}: any is Chat Completions' "required",
    tool (with its ``name``) a named function."""
    if raw is None:
        return ToolChoice()
    kind = raw.get("type") if isinstance(raw, dict) else None
    if not isinstance(kind, str) or kind not in _CHOICES:
        raise GatewayError(
            400, f"tool_choice.type: must be one of {', '.join(_CHOICES)}", param="tool_choice"
        )
    if kind in ("any", "tool") and not names:
        raise GatewayError(
            400, f"tool_choice {kind!r} needs at least one tool", param="tool_choice"
        )
    if kind != "tool":
        return ToolChoice(_CHOICES[kind])
    name = raw.get("name")
    if not isinstance(name, str) or name not in names:
        raise GatewayError(
            400,
            f"tool_choice.name: {name!r} is not one of the tools ({', '.join(names)})",
            param="tool_choice",
        )
    return ToolChoice("function", name)


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
