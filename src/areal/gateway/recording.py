"""Whether a policy call is recorded, said back to the client in response headers.

``x-areal-recorded: true|false`` on every policy answer (``false``: a plain-key call outside any
session, served but never trained on); a call recorded into an online conversation
(:mod:`areal.gateway.online`) also carries ``x-areal-conversation`` (its key) and
``x-areal-session`` (its episode), the names its rewards are posted under, and ``x-areal-group``
when its first call named a group. Headers are added as a response is prepared, so streamed
answers carry them too.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from aiohttp import web

from areal.gateway.online import Conversation
from areal.gateway.online_groups import GROUP

RECORDED = "x-areal-recorded"
CONVERSATION = "x-areal-conversation"  # also the request header that names a conversation
SESSION = "x-areal-session"


@dataclass
class Recording:
    recorded: bool
    conversation: Conversation | None = None
    opened: bool = False  # the call opened its conversation (a failure then closes it again)


RECORDING = web.RequestKey("recording", Recording)


def header_value(text: str) -> str:
    """``text`` as it may travel in a header (printable ASCII as it is, anything else quoted)."""
    return text if text.isascii() and text.isprintable() else quote(text, safe="")


async def add_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: the recording headers of a successful policy call."""
    recording = request.get(RECORDING)
    if recording is None or response.status >= 400:
        return
    response.headers[RECORDED] = "true" if recording.recorded else "false"
    if recording.conversation is not None:
        response.headers[CONVERSATION] = header_value(recording.conversation.key)
        response.headers[SESSION] = recording.conversation.session.session_id
        if recording.conversation.group is not None:
            response.headers[GROUP] = recording.conversation.group  # printable ASCII, checked
