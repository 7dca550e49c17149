"""The gateway's server-sent-event responses (OpenAI chat and Responses, Anthropic messages)."""

from __future__ import annotations

from aiohttp import web

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
