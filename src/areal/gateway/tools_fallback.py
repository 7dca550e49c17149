"""Tools for a policy whose chat template cannot render them.

A template without a tools section (SmolLM2's ChatML, many base-model templates) ignores the
``tools`` variable: the prompt comes out as if the request had none, and a tool-using agent would
train a policy that never saw its tools. The gateway finds that out by rendering a probe chat
with and without a probe tool (:func:`renders_tools`, once per tokenizer) and, when the template
ignores it, says the tools itself in the one format the policy's tool-call parser reads
(Hermes/Qwen, ``<tool_call>{json}</tool_call>``): a tools block in the system turn, past calls as
text in their assistant turns, tool results as user turns (:func:`system_prompt_tools`). The
format is stated in docs/gateway.md, "Tools on a template without tool support"; every request
that uses it is named in ``gateway.log`` and counted (:meth:`PolicyService.note_tools_fallback`).

Calls render exactly as the parser's forced call is generated (``<tool_call>\\n`` + JSON +
``\\n</tool_call>``, the JSON's whitespace that of ``json.dumps``), so the turn after a call the
policy wrote extends it token for token, as with a template that has tools.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

MODE = "system_prompt"  # the ``tools_fallback=`` value of a request's gateway.log line

TOOLS_HEADER = (
    "# Tools\n\nYou may call the functions below to help with the request. Their signatures "
    "are listed inside <tools></tools>, one JSON object per line:\n<tools>"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nTo call a function, answer with a JSON object holding its name and arguments "
    "inside <tool_call></tool_call> tags, one block per call:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <arguments-json-object>}\n</tool_call>'
)
CALL_OPEN, CALL_CLOSE = "<tool_call>\n", "\n</tool_call>"
RESULT_OPEN, RESULT_CLOSE = "<tool_response>\n", "\n</tool_response>"

# A tool no chat template could render by accident: a template renders tools when this name
# appears in the prompt with it and not without it.
PROBE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "areal_probe_tool_7f3c",
        "description": "areal probe: does this chat template render tools?",
        "parameters": {
            "type": "object",
            "properties": {"areal_probe_argument": {"type": "string"}},
        },
    },
}
PROBE_CHAT: list[dict[str, Any]] = [{"role": "user", "content": "areal probe"}]


class ChatTemplate(Protocol):
    """The part of a Hugging Face tokenizer the probe uses."""

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any: ...


def renders_tools(tokenizer: ChatTemplate) -> bool:
    """Does the tokenizer's chat template put the tools a request gives into the prompt?

    Rendered with the probe tool and without it: the tool's name must appear in the first text
    and not in the second. A template that raises on tools (some refuse them outright) renders
    none; one that cannot render the plain probe chat is left alone (said to render tools), so
    its own error reaches the client as before.
    """
    try:
        plain = str(_render(tokenizer, None))
    except Exception:
        return True
    try:
        with_tool = str(_render(tokenizer, [PROBE_TOOL]))
    except Exception:
        return False
    name = PROBE_TOOL["function"]["name"]
    return name in with_tool and name not in plain


def _render(tokenizer: ChatTemplate, tools: list[dict[str, Any]] | None) -> Any:
    return tokenizer.apply_chat_template(
        [dict(m) for m in PROBE_CHAT], tools=tools, tokenize=False, add_generation_prompt=True
    )


def uses_tools(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None) -> bool:
    """Does this chat need a template that renders tools: tools offered, or calls and results
    in its history?"""
    return bool(tools) or any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)


def tools_block(tools: Sequence[dict[str, Any]]) -> str:
    """The system turn's tools section: the header, one function tool per line, the call format."""
    return TOOLS_HEADER + "".join("\n" + _json(t) for t in tools) + TOOLS_FOOTER


def call_text(name: str, arguments: str) -> str:
    """One call as the policy writes it (``arguments``: JSON text, inserted unchanged, so the
    policy's own call renders back as it was generated)."""
    return f'{CALL_OPEN}{{"name": {_json(name)}, "arguments": {arguments}}}{CALL_CLOSE}'


def system_prompt_tools(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """Policy messages (:mod:`.chat_messages`) that say the tools and calls in plain turns.

    - ``tools``: :func:`tools_block` appended to a leading system message (after a blank line),
      or a new system message holding only it (so a template's own default system turn, added
      when the chat opens without one, is not rendered);
    - an assistant message's ``tool_calls``: :func:`call_text` each, one per line, after its
      content (a line break between content and the first call);
    - ``tool`` messages: one ``user`` turn per run of consecutive results, each result inside
      ``<tool_response>\\n...\\n</tool_response>``, on its own line.
    """
    out: list[dict[str, Any]] = []
    results: dict[str, Any] | None = None  # the user turn the current run of results goes to
    for message in messages:
        role, content = message["role"], message["content"]
        if role == "tool":
            result = RESULT_OPEN + content + RESULT_CLOSE
            if results is None:
                results = {"role": "user", "content": result}
                out.append(results)
            else:
                results["content"] += "\n" + result
            continue
        results = None
        if role == "assistant" and message.get("tool_calls"):
            calls = [
                call_text(c["function"]["name"], c["function"]["arguments"])
                for c in message["tool_calls"]
            ]
            content = "\n".join([content, *calls] if content else calls)
        out.append({"role": role, "content": content})
    if tools:
        block = tools_block(tools)
        if out and out[0]["role"] == "system":
            system = out[0]["content"]
            out[0]["content"] = f"{system}\n\n{block}" if system else block
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def _json(value: Any) -> str:
    """JSON as a chat template's ``tojson`` writes it (Hugging Face's: no ASCII escaping)."""
    return json.dumps(value, ensure_ascii=False)
