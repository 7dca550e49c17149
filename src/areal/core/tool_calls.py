"""Tool calls in generated text: the records and the protocol a parser plugin implements.

A chat-template family writes tool calls its own way (Qwen/Hermes: ``<tool_call>{json}</tool_call>``);
a parser turns the policy's text back into content plus calls, whole or while streaming. Parsers
are registered with ``areal_register_tool_parsers`` as ``register(name, factory)``.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Literal, Protocol


def new_call_id(prefix: str = "call_") -> str:
    return prefix + secrets.token_hex(12)


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object, as text (a cut-off call's: the part that was written)
    id: str = field(default_factory=new_call_id)
    # The token limit cut the call before its JSON closed: ``arguments`` is as far as it got.
    truncated: bool = False


@dataclass
class ParsedOutput:
    content: str
    tool_calls: list[ToolCall]


@dataclass
class StreamEvent:
    kind: Literal["text", "tool_call"]
    text: str = ""
    call: ToolCall | None = None


class ToolCallStream(Protocol):
    def feed(self, delta: str) -> list[StreamEvent]:
        """Consume new text; return what can be said for sure (text held back while it may still
        turn out to open a tool call)."""
        ...

    def finish(self) -> list[StreamEvent]:
        """The generation ended: flush what is held back."""
        ...


class ToolCallParser(Protocol):
    def parse(self, text: str) -> ParsedOutput: ...

    def new_stream(self) -> ToolCallStream: ...

    def forced_prefix(self) -> str:
        """Text that opens a tool call, appended to the prompt when a call is forced."""
        ...

    def forced_suffix(self) -> str:
        """Text that closes a tool call, generated after a forced call's JSON (before the stop
        token): prefix + JSON + suffix must be the chat template's rendering of that call, so the
        next turn, which sends the call back, extends the forced one token for token."""
        ...
