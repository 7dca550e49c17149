"""Protocol-neutral chat helpers: the one message shape the policy renders, tools, forced calls.

Every protocol module (Chat Completions, Responses, Anthropic Messages) turns its request into
*policy messages* — OpenAI-shaped dicts with ``role`` in system/user/assistant/tool, ``content``
a plain string, assistant ``tool_calls`` with JSON-text arguments, tool ``tool_call_id`` — and
*function tools* ``{"type": "function", "function": {"name", "description", "parameters"}}``.
Those are what :meth:`areal.gateway.policy.PolicyService.render` feeds the chat template, so the
protocols differ only in parsing and answering, never in how a prompt becomes tokens. The way
back is shared too: one grammar for a forced call (:func:`forced_call_tag`), one way to read
calls out of the output, whole (:func:`split_output`) or streamed (:class:`OutputStream`), both
through the policy's registered tool-call parser; the protocols only dress the result.

Bad input raises :class:`GatewayError` (400) naming the offending field, e.g.
``messages[3].role``, so the client sees what to fix and the gateway never answers 500.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import jiter

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

# The json_schema for ``json_object`` output (Chat Completions ``response_format``, Responses
# ``text.format``): an object, as the name says; "any JSON" would allow arrays and scalars.
JSON_OBJECT_SCHEMA = json.dumps({"type": "object"})

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


# What a hosted tool's type looks like on every protocol (``web_search``, ``namespace``,
# ``code_interpreter``, ``web_search_20250305``, ``bash_20250124``); anything else is a 400.
HOSTED_TOOL_TYPE = re.compile(r"[a-z][a-z0-9_]{0,63}")


def hosted_tool_kind(tool: dict[str, Any], where: str) -> str:
    """The type of a tool the policy cannot call, named for the log (``web_search``, ...).

    The rule on every protocol: the policy is offered function tools only. A hosted or built-in
    tool (web search, file search, computer use, code interpreter, a namespace, a freeform custom
    tool...) is something the provider runs or a format the chat template cannot say, so it is
    left out of the prompt, counted and named in the request's ``gateway.log`` line
    (:meth:`~areal.gateway.policy.PolicyService.note_dropped_tools`); the request is served.
    """
    kind = tool.get("type")
    if not isinstance(kind, str) or not HOSTED_TOOL_TYPE.fullmatch(kind):
        shown = repr(kind)[:80] if isinstance(kind, str) else type_name(kind)
        raise bad(
            f"{where}.type",
            f"unknown tool type {shown}: function tools are offered to the policy, hosted tools "
            "(web_search, namespace, ...) are left out of its prompt",
        )
    return kind


def normalize_tools(
    tools: Any, param: str = "tools", dropped: list[str] | None = None
) -> list[dict[str, Any]]:
    """Chat Completions ``tools``: each ``{"type": "function", "function": {...}}``; names unique.
    Other tool types are left out (:func:`hosted_tool_kind`), their types added to ``dropped``."""
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
        if tool.get("type", "function") != "function":
            if dropped is not None:
                dropped.append(hosted_tool_kind(tool, where))
            continue
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
    """The json_schema of the JSON of a call of ``name`` (or of any of ``tools``)."""
    chosen = [t for t in tools if name is None or t["function"]["name"] == name]
    if not chosen:
        raise ValueError(f"no tool named {name!r}")
    if len(chosen) == 1:
        return call_schema(chosen[0])
    return {"anyOf": [call_schema(t) for t in chosen]}


def forced_call_tag(schema: dict[str, Any], suffix: str) -> dict[str, Any]:
    """The grammar of a forced call's output: its JSON (``schema``), then the parser's closing
    ``suffix``, as an xgrammar structural tag, the ``structural_tag`` that vLLM, SGLang and the
    embedded engine all take. The output is then the call exactly as the chat template renders it
    when the next turn sends it back, so that turn extends this one token for token."""
    json_part = {"type": "json_schema", "json_schema": schema}
    if not suffix:
        return {"type": "structural_tag", "format": json_part}
    closing = {"type": "const_string", "value": suffix}
    return {
        "type": "structural_tag",
        "format": {"type": "sequence", "elements": [json_part, closing]},
    }


@dataclass
class ToolPlan:
    """How to run one request's tools: what to render, what to prefix, what to constrain."""

    tools: list[dict[str, Any]] = field(default_factory=list)  # offered in the prompt
    parse_calls: bool = False  # look for tool calls in the output
    prefix: str = ""  # appended to the prompt: opens the forced call
    json_schema: dict[str, Any] | None = None  # the forced call's JSON
    suffix: str = ""  # generated after the forced call's JSON: closes it
    forced_names: tuple[str, ...] = ()  # the tools a forced call may call, in order

    @property
    def forced(self) -> bool:
        return self.json_schema is not None


def grammar_params(plan: ToolPlan, json_schema: str | None = None) -> dict[str, str]:
    """The engine's grammar, as SGLang sampling params (strings): a forced call's structural tag
    (:func:`forced_call_tag`), else ``json_schema`` (a JSON response format), else none. One place
    for every protocol, so the same request asks every engine for the same output."""
    if plan.json_schema is not None:
        return {"structural_tag": json.dumps(forced_call_tag(plan.json_schema, plan.suffix))}
    return {"json_schema": json_schema} if json_schema is not None else {}


def plan_tools(
    tools: list[dict[str, Any]],
    choice: ToolChoice,
    parser: ToolCallParser,
    param: str = "tool_choice",
) -> ToolPlan:
    """Turn tools + choice into a :class:`ToolPlan`; a forced choice without its tool is a 400.

    A forced call (``required`` or a named function) opens the call in the prompt with the
    parser's prefix and constrains the rest to the call's JSON, as vLLM and SGLang do, so the
    arguments always parse and satisfy the tool's schema, then to the parser's closing suffix.
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
    return forced_plan(tools, parser, [choice.name] if choice.name else tool_names(tools))


def forced_plan(tools: list[dict[str, Any]], parser: ToolCallParser, names: list[str]) -> ToolPlan:
    """All of ``tools`` in the prompt, the output forced to be a call of one of ``names``."""
    chosen = [t for t in tools if t["function"]["name"] in names]
    return ToolPlan(
        tools=tools,
        parse_calls=True,
        prefix=parser.forced_prefix(),
        json_schema=forced_call_schema(chosen),
        suffix=parser.forced_suffix(),
        forced_names=tuple(tool_names(chosen)),
    )


def allowed_tools_plan(
    choice: dict[str, Any], tools: list[dict[str, Any]], parser: ToolCallParser, param: str
) -> ToolPlan:
    """``tool_choice: {"type": "allowed_tools", ...}``: Chat Completions nests ``mode`` and
    ``tools`` under ``allowed_tools`` (tools as ``{"type": "function", "function": {"name"}}``),
    Responses has them beside ``type`` (tools as ``{"type": "function", "name"}``). Every tool
    stays in the prompt (the same prompt as the episode's other turns); "required" forces a call
    of one of the listed tools, "auto" leaves the choice to the model."""
    spec = choice.get("allowed_tools", choice)
    where = f"{param}.allowed_tools" if "allowed_tools" in choice else param
    if not isinstance(spec, dict):
        raise bad(where, f"must be an object with mode and tools, got {type_name(spec)}")
    listed = spec.get("tools")
    if not isinstance(listed, list) or not listed:
        raise bad(f"{where}.tools", "allowed_tools needs a non-empty list of tools")
    names = [_listed_name(t) for t in listed]
    unknown = [n for n in names if n not in tool_names(tools)]
    if unknown:
        raise bad(f"{where}.tools", f"names tools that are not among the tools: {unknown}")
    mode = spec.get("mode", "auto")
    if mode == "required":
        return forced_plan(tools, parser, [n for n in names if isinstance(n, str)])
    if mode != "auto":
        raise bad(f"{where}.mode", f"must be 'auto' or 'required', got {json.dumps(mode)[:80]}")
    return ToolPlan(tools=tools, parse_calls=True)


def _listed_name(tool: Any) -> Any:
    if not isinstance(tool, dict):
        return None
    fn = tool.get("function")
    return fn.get("name") if isinstance(fn, dict) else tool.get("name")


# --- reading calls out of the output --------------------------------------------------------


def split_output(
    plan: ToolPlan, parser: ToolCallParser, text: str, cut: bool = False
) -> tuple[str, list[ToolCall]]:
    """A finished reply's content and tool calls; a forced call's output is read after its prefix
    (which was in the prompt). A forced call the token limit ``cut`` is still the call, as far as
    it was written (:func:`cut_forced_call`); other output that does not parse is text."""
    if not plan.parse_calls:
        return text, []
    parsed = parser.parse(plan.prefix + text)
    if not parsed.tool_calls:
        if plan.forced and cut:
            return "", [cut_forced_call(plan, text)]
        return text, []
    return parsed.content, parsed.tool_calls


# The start of a forced call's JSON (:func:`call_schema` puts the name first): the name, whole or
# begun, then the opening of the arguments.
_CALL_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)("?)')
_CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')


def suffix_start(text: str, suffix: str) -> int:
    """Where a forced call's closing ``suffix`` begins at the end of ``text``, whole or cut by the
    token limit (``len(text)`` when it has not begun). The suffix follows the JSON's final ``}``,
    and Hermes' ``\\n</tool_call>`` cannot end the JSON before it (a raw newline is no JSON string
    character; between tokens it is whitespace, which a reader holds back anyway)."""
    for n in range(min(len(suffix), len(text)), 0, -1):
        if text.endswith(suffix[:n]):
            return len(text) - n
    return len(text)


def cut_forced_call(plan: ToolPlan, text: str) -> ToolCall:
    """The call a forced generation was writing when the token limit cut it: its name, and its
    arguments exactly as far as they were written (unclosed JSON, or "" before they began), as
    the OpenAI and Anthropic APIs return a truncated call. A name cut mid-way is the first of the
    forced tools it begins (the grammar allows only those). A call cut in its closing suffix is
    whole: its JSON was complete."""
    text = text[: suffix_start(text, plan.suffix)]
    with contextlib.suppress(ValueError):
        value = json.loads(text)
        if isinstance(value, dict) and isinstance(value.get("name"), str):
            arguments = value.get("arguments")
            if isinstance(arguments, dict):
                return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))
    head = _CALL_HEAD.match(text)
    if head is not None:
        return ToolCall(json.loads(head.group(1)), text[head.end() :], truncated=True)
    begun = _CALL_NAME.match(text)
    written = begun.group(1) if begun else ""
    if begun and begun.group(2):  # the name is whole
        with contextlib.suppress(json.JSONDecodeError):
            return ToolCall(json.loads(f'"{written}"'), "", truncated=True)
    names = [n for n in plan.forced_names if n.startswith(written)] or list(plan.forced_names)
    return ToolCall(names[0], "", truncated=True)


def partial_arguments(arguments: str) -> dict[str, Any]:
    """A call's arguments as an object, a cut-off call's parsed as far as they go (a string cut
    mid-way kept as written), as the Anthropic SDK reads a streamed ``input_json_delta``."""
    try:
        value = jiter.from_json(arguments.encode(), partial_mode="trailing-strings")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class ForcedCallReader:
    """The call a forced generation is writing, read while it grows, for a protocol that streams
    a call's arguments (Anthropic's ``input_json_delta``) rather than saying the call whole.

    :func:`call_schema` makes the output ``{"name": "...", "arguments": {...}}`` with the name
    first, so the name is known early; the text after ``"arguments":`` goes out as it comes,
    holding back what may be the outer ``}`` and the plan's closing ``suffix`` after it. The
    finished text is still the parser's to read (:class:`OutputStream`); this only says early
    what the grammar already fixes.
    """

    _TAIL = re.compile(r"\s*\}?\s*$")

    def __init__(self, suffix: str = "") -> None:
        self.suffix = suffix
        self.name: str | None = None
        self.start = 0
        self.sent = 0

    def update(self, text: str, final: bool, cut: ToolCall | None = None) -> tuple[str | None, str]:
        """(the name, when it has just become known; the new part of the arguments), from the
        cumulative ``text`` (a trailing partial character is held back until it completes).
        ``cut``: the final text is a call the token limit cut (:func:`cut_forced_call`); a
        truncated one's arguments end as written, with no outer ``}`` to hold back."""
        if not final:
            text = text.rstrip("\ufffd")
        text = text[: suffix_start(text, self.suffix)]
        if cut is not None and not cut.truncated:
            cut = None  # cut in its closing suffix: the JSON is whole, as in a finished call
        opened = None
        if self.name is None:
            match = _CALL_HEAD.match(text)
            if match is not None and match.end() == len(text) and not final:
                match = None  # more space may follow the colon: the arguments start after it
            if match is None:
                if cut is None:
                    return None, ""
                self.name = cut.name  # cut before its arguments began
                return cut.name, ""
            self.name = opened = json.loads(match.group(1))
            self.start = self.sent = match.end()
        body = text[self.start :]
        if cut is not None:
            stable = len(text)
        elif final:
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
        self.plan = plan
        self.called = False  # a call has been said

    def step(self, gen: Generation) -> list[StreamEvent]:
        """What ``gen`` (the generation so far; the last one is finished) adds."""
        delta = self.text.step(gen)
        if self.calls is None:
            return [StreamEvent("text", delta)] if delta else []
        events = self.calls.feed(delta) if delta else []
        if gen.finished:
            events += self.calls.finish()
        said = self.called or any(e.kind == "tool_call" for e in events)
        if self.plan.forced and gen.finish_reason == "length" and gen.finished and not said:
            # the forced call, cut by the limit: still the call, as far as it was written
            events = [StreamEvent("tool_call", call=cut_forced_call(self.plan, gen.text))]
            said = True
        self.called = said
        if self.strip_prefix:
            for i, event in enumerate(events):
                if event.kind == "text":
                    events[i] = StreamEvent("text", event.text.removeprefix(self.strip_prefix))
                    self.strip_prefix = ""
                    break
        return events
