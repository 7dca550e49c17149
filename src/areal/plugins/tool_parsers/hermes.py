"""Qwen / Hermes tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

Text that looks like a call but is not valid JSON stays content, so nothing the model wrote is lost.
A call ends at ``</tool_call>``, at the next ``<tool_call>`` (the model forgot to close it) or at
the end of the output; whole texts and streams are parsed by the same code, so they always agree.
"""

from __future__ import annotations

import json

from areal.core.tool_calls import ParsedOutput, StreamEvent, ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def parse_call(body: str) -> ToolCall | None:
    """One call's JSON, or None if it is not ``{"name": str, "arguments": object}``."""
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters"))
    if arguments is None:  # a call of a function without arguments
        arguments = {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(name=value["name"], arguments=json.dumps(arguments, ensure_ascii=False))


class HermesParser:
    def forced_prefix(self) -> str:
        return OPEN + "\n"

    def forced_suffix(self) -> str:
        return "\n" + CLOSE  # the chat template closes a call with "}\n</tool_call>"

    def parse(self, text: str) -> ParsedOutput:
        # The whole text goes through the streaming parser, so both ways always agree.
        stream = HermesStream()
        events = stream.feed(text) + stream.finish()
        calls = [e.call for e in events if e.kind == "tool_call" and e.call is not None]
        if not calls:
            return ParsedOutput(content=text, tool_calls=[])
        content = "".join(e.text for e in events if e.kind == "text")
        return ParsedOutput(content=content.strip(), tool_calls=calls)

    def new_stream(self) -> HermesStream:
        return HermesStream()


class HermesStream:
    """Emits text as soon as it cannot be the start of ``<tool_call>``, and each call when it closes."""

    def __init__(self) -> None:
        self.buffer = ""
        self.inside = False

    def feed(self, delta: str) -> list[StreamEvent]:
        self.buffer += delta
        events: list[StreamEvent] = []
        while True:
            if self.inside:
                end = self.buffer.find(CLOSE)
                reopen = self.buffer.find(OPEN)
                if reopen >= 0 and (end < 0 or reopen < end):
                    # A new call opens before this one closed: this one ends here, unclosed.
                    body, self.buffer = self.buffer[:reopen], self.buffer[reopen:]
                    self.inside = False
                    events.append(self._call_or_text(body, closed=False))
                    continue
                if end < 0:
                    return events
                body, self.buffer = self.buffer[:end], self.buffer[end + len(CLOSE) :]
                self.inside = False
                events.append(self._call_or_text(body, closed=True))
                continue
            start = self.buffer.find(OPEN)
            if start >= 0:
                if start:
                    events.append(StreamEvent("text", self.buffer[:start]))
                self.buffer = self.buffer[start + len(OPEN) :]
                self.inside = True
                continue
            keep = _partial_tag(self.buffer)
            if len(self.buffer) > keep:
                events.append(StreamEvent("text", self.buffer[: len(self.buffer) - keep]))
                self.buffer = self.buffer[len(self.buffer) - keep :]
            return events

    def finish(self) -> list[StreamEvent]:
        rest, self.buffer = self.buffer, ""
        if self.inside:
            self.inside = False
            return [self._call_or_text(rest, closed=False)]
        return [StreamEvent("text", rest)] if rest else []

    @staticmethod
    def _call_or_text(body: str, closed: bool) -> StreamEvent:
        call = parse_call(body.strip())
        if call is not None:
            return StreamEvent("tool_call", call=call)
        return StreamEvent("text", OPEN + body + (CLOSE if closed else ""))


def _partial_tag(text: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``<tool_call>``."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0
