"""Protocol-neutral chat helpers: the one message shape the policy renders, tools, forced calls.

Every protocol module (Chat Completions, Responses, Anthropic Messages) turns its request into
*policy messages* — OpenAI-shaped dicts with ``role`` in system/user/assistant/tool, ``content``
a plain string, assistant ``tool_calls`` with JSON-text arguments, tool ``tool_call_id`` — and
*function tools* ``{"type": "function", "function": {"name", "description", "parameters"}}``.
Those are what :meth:`areal.gateway.policy.PolicyService.render` feeds the chat template, so the
protocols differ only in parsing and answering, never in how a prompt becomes tokens. The way
back is shared too: one grammar for a forced call (:func:`forced_call_schema`), one way to read
calls out of the output, whole (:func:`split_output`) or streamed (:class:`OutputStream`), both
through the policy's registered tool-call parser; the protocols only dress the result.

Bad input raises :class:`GatewayError` (400) naming the offending field, e.g.
``messages[3].role``, so the client sees what to fix and the gateway never answers 500.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from areal.core.stop_strings import StopHoldBack
from areal.core.tool_calls import StreamEvent, ToolCall, ToolCallParser
from areal.gateway.errors import GatewayError
from areal.gateway.policy import Generation, TextDeltas

POLICY_ROLES = ("system", "user", "assistant", "tool")
# Roles other protocols' clients send that mean one of the above.
ROLE_ALIASES = {"developer": "system", "function": "tool"}
# Content-part types whose text the policy reads (Chat Completions, Responses, refusals).
TEXT_PART_KEYS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal"}


def bad(param: str, message: str) -> GatewayError:
    """A 400 about one request field."""
    return GatewayError(400, f"{param}: {message}", param=param)


def type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


# --- messages -------------------------------------------------------------------------------


def content_text(content: Any, param: str) -> str:
    """A message's content as one string: a string, a list of text parts, or null (empty)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(
            param, f"content must be a string or a list of text parts, got {type_name(content)}"
        )
    texts: list[str] = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            raise bad(f"{param}[{j}]", f"a content part must be an object, got {type_name(part)}")
        kind = part.get("type", "text")
        key = TEXT_PART_KEYS.get(kind) if isinstance(kind, str) else None
        if key is None:
            raise bad(
                f"{param}[{j}].type",
                f"the policy reads text only; content parts of type {kind!r} are not supported",
            )
        text = part.get(key)
        if not isinstance(text, str):
            raise bad(f"{param}[{j}].{key}", f"must be a string, got {type_name(text)}")
        texts.append(text)
    return "".join(texts)


def arguments_text(arguments: Any, param: str) -> str:
    """Tool-call arguments as JSON text; a string is kept exactly (it may be the model's own)."""
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        return arguments
    if isinstance(arguments, dict):
        return json.dumps(arguments, ensure_ascii=False)
    raise bad(param, f"must be a JSON string or an object, got {type_name(arguments)}")


def normalize_tool_calls(calls: Any, param: str) -> list[dict[str, Any]]:
    """Assistant ``tool_calls`` as ``{"id", "type": "function", "function": {"name", "arguments"}}``."""
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise bad(param, f"must be a list of tool calls, got {type_name(calls)}")
    out: list[dict[str, Any]] = []
    for j, call in enumerate(calls):
        where = f"{param}[{j}]"
        if not isinstance(call, dict):
            raise bad(where, f"a tool call must be an object, got {type_name(call)}")
        fn = call.get("function", call)  # some clients flatten name/arguments into the call
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad(f"{where}.function.name", "a tool call needs a function name")
        call_id = call.get("id")
        out.append(
            {
                "id": call_id if isinstance(call_id, str) else f"call_{j}",
                "type": "function",
                "function": {
                    "name": fn["name"],
                    "arguments": arguments_text(fn.get("arguments"), f"{where}.function.arguments"),
                },
            }
        )
    return out


def normalize_message(message: Any, i: int, param: str = "messages") -> dict[str, Any]:
    """One OpenAI-style message as a policy message; ``name`` and unknown keys are dropped."""
    where = f"{param}[{i}]"
    if not isinstance(message, dict):
        raise bad(where, f"a message must be an object, got {type_name(message)}")
    role = message.get("role")
    if not isinstance(role, str):
        raise bad(f"{where}.role", f"a message needs a role, got {type_name(role)}")
    role = ROLE_ALIASES.get(role, role)
    if role not in POLICY_ROLES:
        raise bad(
            f"{where}.role",
            f"unknown role {message['role']!r} in message {i}; expected one of "
            "system, developer, user, assistant, tool",
        )
    out: dict[str, Any] = {
        "role": role,
        "content": content_text(message.get("content"), f"{where}.content"),
    }
    if role == "assistant":
        calls = normalize_tool_calls(message.get("tool_calls"), f"{where}.tool_calls")
        legacy = message.get("function_call")
        if not calls and isinstance(legacy, dict):  # the pre-tools form of one call
            calls = normalize_tool_calls([{"function": legacy}], f"{where}.function_call")
        if calls:
            out["tool_calls"] = calls
    elif role == "tool" and isinstance(message.get("tool_call_id"), str):
        out["tool_call_id"] = message["tool_call_id"]
    return out


def normalize_messages(messages: Any, param: str = "messages") -> list[dict[str, Any]]:
    """Chat Completions ``messages`` as policy messages (mid-chat system turns and consecutive
    same-role turns are kept as they are: the template renders them)."""
    if not isinstance(messages, list):
        raise bad(param, f"must be a list of messages, got {type_name(messages)}")
    if not messages:
        raise bad(param, "must contain at least one message")
    return [normalize_message(m, i, param) for i, m in enumerate(messages)]


# --- tools ----------------------------------------------------------------------------------

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def function_tool(name: Any, description: Any, parameters: Any, param: str) -> dict[str, Any]:
    """One validated function tool in the policy's shape (other protocols build theirs here).

    A missing ``parameters`` means a function without arguments; a present one must be a JSON
    schema object describing an object, since the call's arguments are a JSON object.
    """
    if not isinstance(name, str) or not name:
        raise bad(f"{param}.name", f"a tool needs a non-empty name, got {name!r}")
    if parameters is None:
        parameters = dict(EMPTY_PARAMETERS)
    if not isinstance(parameters, dict):
        raise bad(
            f"{param}.parameters",
            f"must be a JSON schema object, got {type_name(parameters)} (tool {name!r})",
        )
    kind = parameters.get("type", "object")
    if kind != "object" and not (isinstance(kind, list) and "object" in kind):
        raise bad(
            f"{param}.parameters.type",
            f"tool {name!r}: arguments are a JSON object, so the schema's type must be 'object', "
            f"got {kind!r}",
        )
    fn: dict[str, Any] = {"name": name}
    if isinstance(description, str) and description:
        fn["description"] = description
    fn["parameters"] = parameters
    return {"type": "function", "function": fn}


def normalize_tools(tools: Any, param: str = "tools") -> list[dict[str, Any]]:
    """Chat Completions ``tools``: each ``{"type": "function", "function": {...}}``; names unique."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise bad(param, f"must be a list of tools, got {type_name(tools)}")
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"{param}[{i}]"
        if not isinstance(tool, dict):
            raise bad(where, f"a tool must be an object, got {type_name(tool)}")
        kind = tool.get("type", "function")
        if kind != "function":
            raise bad(f"{where}.type", f"only function tools are supported, got {kind!r}")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise bad(f"{where}.function", f"must be an object, got {type_name(fn)}")
        spec = function_tool(
            fn.get("name"), fn.get("description"), fn.get("parameters"), f"{where}.function"
        )
        name = spec["function"]["name"]
        if name in seen:
            raise bad(f"{where}.function.name", f"tool {name!r} is defined twice")
        seen.add(name)
        out.append(spec)
    return out


def tool_names(tools: Sequence[dict[str, Any]]) -> list[str]:
    return [t["function"]["name"] for t in tools]


# --- tool choice and forced calls -----------------------------------------------------------

ChoiceMode = Literal["none", "auto", "required", "function"]


@dataclass(frozen=True)
class ToolChoice:
    """What the client allows: no tools, the model's choice, some call, or one named function."""

    mode: ChoiceMode = "auto"
    name: str | None = None


def openai_tool_choice(value: Any, param: str = "tool_choice") -> ToolChoice:
    """Chat Completions ``tool_choice``: "none" | "auto" | "required" | a named function."""
    if value is None:
        return ToolChoice()
    if isinstance(value, str):
        if value in ("none", "auto", "required"):
            return ToolChoice(value)  # type: ignore[arg-type]
        if value == "any":  # what some frameworks send for "required"
            return ToolChoice("required")
        raise bad(param, f"must be 'none', 'auto', 'required' or a function, got {value!r}")
    if isinstance(value, dict):
        fn = value.get("function")
        name = fn.get("name") if isinstance(fn, dict) else value.get("name")
        if value.get("type", "function") == "function" and isinstance(name, str) and name:
            return ToolChoice("function", name)
        if value.get("type") in ("none", "auto", "required"):
            return ToolChoice(value["type"])
    raise bad(
        param,
        'a named tool choice is {"type": "function", "function": {"name": ...}}, '
        f"got {json.dumps(value)[:200]}",
    )


def call_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """The JSON a Hermes-style call of ``tool`` consists of: its name, then its arguments."""
    fn = tool["function"]
    return {
        "type": "object",
        "properties": {
            "name": {"const": fn["name"]},
            "arguments": fn.get("parameters") or EMPTY_PARAMETERS,
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def forced_call_schema(tools: Sequence[dict[str, Any]], name: str | None = None) -> dict[str, Any]:
    """The json_schema that makes the engine write a call of ``name`` (or of any of ``tools``)."""
    chosen = [t for t in tools if name is None or t["function"]["name"] == name]
    if not chosen:
        raise ValueError(f"no tool named {name!r}")
    if len(chosen) == 1:
        return call_schema(chosen[0])
    return {"anyOf": [call_schema(t) for t in chosen]}


@dataclass
class ToolPlan:
    """How to run one request's tools: what to render, what to prefix, what to constrain."""

    tools: list[dict[str, Any]] = field(default_factory=list)  # offered in the prompt
    parse_calls: bool = False  # look for tool calls in the output
    prefix: str = ""  # appended to the prompt: opens the forced call
    json_schema: dict[str, Any] | None = None  # constrains the forced call

    @property
    def forced(self) -> bool:
        return self.json_schema is not None


def plan_tools(
    tools: list[dict[str, Any]],
    choice: ToolChoice,
    parser: ToolCallParser,
    param: str = "tool_choice",
) -> ToolPlan:
    """Turn tools + choice into a :class:`ToolPlan`; a forced choice without its tool is a 400.

    A forced call (``required`` or a named function) opens the call in the prompt with the
    parser's prefix and constrains the rest to the call's JSON, as vLLM and SGLang do, so the
    arguments always parse and satisfy the tool's schema.
    """
    if choice.mode == "none" or (not tools and choice.mode == "auto"):
        return ToolPlan()
    if not tools:
        raise bad(param, f"tool_choice {choice.mode!r} needs tools, but the request has none")
    if choice.mode == "auto":
        return ToolPlan(tools=tools, parse_calls=True)
    if choice.mode == "function" and choice.name not in tool_names(tools):
        raise bad(
            param,
            f"tool_choice names {choice.name!r}, which is not among the tools "
            f"({', '.join(tool_names(tools))})",
        )
    return ToolPlan(
        tools=tools,
        parse_calls=True,
        prefix=parser.forced_prefix(),
        json_schema=forced_call_schema(tools, choice.name),
    )


# --- reading calls out of the output --------------------------------------------------------


def split_output(plan: ToolPlan, parser: ToolCallParser, text: str) -> tuple[str, list[ToolCall]]:
    """A finished reply's content and tool calls; a forced call's output is read after its prefix
    (which was in the prompt), and one that does not parse is the reply's text as written."""
    if not plan.parse_calls:
        return text, []
    parsed = parser.parse(plan.prefix + text)
    if not parsed.tool_calls:
        return text, []
    return parsed.content, parsed.tool_calls


class ForcedCallReader:
    """The call a forced generation is writing, read while it grows, for a protocol that streams
    a call's arguments (Anthropic's ``input_json_delta``) rather than saying the call whole.

    :func:`call_schema` makes the output ``{"name": "...", "arguments": {...}}`` with the name
    first, so the name is known early; the text after ``"arguments":`` goes out as it comes,
    holding back what may be the outer ``}``. The finished text is still the parser's to read
    (:class:`OutputStream`); this only says early what the grammar already fixes.
    """

    _HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')
    _TAIL = re.compile(r"\s*\}?\s*$")

    def __init__(self) -> None:
        self.name: str | None = None
        self.start = 0
        self.sent = 0

    def update(self, text: str, final: bool) -> tuple[str | None, str]:
        """(the name, when it has just become known; the new part of the arguments), from the
        cumulative ``text`` (a trailing partial character is held back until it completes)."""
        if not final:
            text = text.rstrip("\ufffd")
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


# --- streamed text --------------------------------------------------------------------------


def stop_strings(value: Any, param: str = "stop") -> list[str]:
    """``stop`` as a list: a string or a list of strings; empty strings are dropped."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return [s for s in value if s]
    raise bad(param, f"must be a string or a list of strings, got {json.dumps(value)[:200]}")


class StreamText:
    """A stream's generations → safe text deltas.

    Holds back a tail that may be the start of a stop string: the engine streams text before it
    knows whether a stop string completes, and trims the whole stop string from its final text,
    so a client must never see the first half of one. Partial characters are held back by
    :class:`TextDeltas`, and the final text closes the stream exactly.
    """

    def __init__(self, stops: Sequence[str] = ()) -> None:
        self._deltas = TextDeltas()
        self._hold = StopHoldBack(stops)

    def step(self, gen: Generation) -> str:
        if gen.finished:  # the final text closes the stream, held tail or not
            return self._deltas.final(gen.text)
        return self._deltas.say(self._hold.push(self._deltas.new_text(gen)))


class OutputStream:
    """Cumulative generations → the text and tool calls that can be said for sure, for every
    protocol's stream.

    Text passes the stop-string hold-back (:class:`StreamText`), then, when the plan reads tool
    calls, the parser's stream, which holds back what may open a call and says each call once it
    is complete. A forced call's prefix (in the prompt) is fed to the parser first, and taken off
    again when the call does not parse and comes out as text, since the model wrote only the rest.
    """

    def __init__(self, plan: ToolPlan, parser: ToolCallParser, stops: Sequence[str] = ()) -> None:
        self.text = StreamText(stops)
        self.calls = parser.new_stream() if plan.parse_calls else None
        if self.calls is not None and plan.prefix:
            self.calls.feed(plan.prefix)  # the forced call was opened in the prompt
        self.strip_prefix = plan.prefix

    def step(self, gen: Generation) -> list[StreamEvent]:
        """What ``gen`` (the generation so far; the last one is finished) adds."""
        delta = self.text.step(gen)
        if self.calls is None:
            return [StreamEvent("text", delta)] if delta else []
        events = self.calls.feed(delta) if delta else []
        if gen.finished:
            events += self.calls.finish()
        if self.strip_prefix:
            for i, event in enumerate(events):
                if event.kind == "text":
                    events[i] = StreamEvent("text", event.text.removeprefix(self.strip_prefix))
                    self.strip_prefix = ""
                    break
        return events
