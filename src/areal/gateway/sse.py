"""The gateway's server-sent-event responses (OpenAI chat and Responses, Anthropic messages)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from areal.host import fast_json

SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


class EventStreamResponse(web.StreamResponse):
    """A ``text/event-stream`` response whose headers leave with its first event.

    aiohttp's ``StreamResponse`` sends its headers alone at ``prepare()``. Every streaming route
    writes its first event straight after, so that is a socket send per stream for nothing.
    """

    _send_headers_immediately = False

    def __init__(self) -> None:
        super().__init__(headers=SSE_HEADERS)


def sse_event(data: Any, name: str | None = None) -> bytes:
    """One server-sent event carrying ``data`` as JSON, named ``name`` when given (the
    Anthropic and Responses streams name theirs; OpenAI chat's are unnamed)."""
    event = b"data: " + fast_json.dumps_bytes(data) + b"\n\n"
    return event if name is None else b"event: " + name.encode() + b"\n" + event
