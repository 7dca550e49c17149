"""The group an online conversation trains in: the one its client names, else a default rule.

GRPO and RLOO compare a sample only with the other samples of its group
(:mod:`areal.plugins.losses.advantages`): a conversation alone in its group has advantage 0 and
teaches nothing, however it was rated. So every online conversation gets a group:

- **named** by its client, on its first call: the ``x-areal-group`` request header, or
  ``metadata.areal_group`` in the body (OpenAI chat completions and responses, Anthropic
  messages: each has a ``metadata`` object its SDK sends). The episode's ``metadata["group"]``
  is ``online:NAME``: the prefix keeps a client's name from ever joining a rollout worker's task
  group (``task-3``) or a default group. A later call of the conversation may repeat its group
  or name none; naming another is a ``409`` (``group_conflict``);
- else **by default**, when the conversation is handed to the trainer (``--online-grouping``):

  - ``pool`` (the default): the unnamed conversations handed over one after another share a
    group, at most ``--online-group-size`` of them, within ``--online-group-window`` seconds of
    its first. Each is compared with the others rated around it: a baseline across prompts, as
    REINFORCE++ (Hu 2025) uses for every prompt;
  - ``prompt``: the same, but only conversations whose first user message is the same share a
    group (GRPO's own baseline, for a product whose users ask the same things);
  - ``none``: each alone, as before (for an advantage that needs no group).

The trainer trains a group with the members that arrived when its batch forms (an online group
announces no size): the default rule decides who may share a baseline, the batch who does.
Which default: ``bench/online_grouping.py`` measures the three on simulated traffic (the figures
are in docs/gateway.md, "Groups"). The rule's time is its ``clock`` (injectable for tests).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from areal.gateway.errors import GatewayError
from areal.gateway.training_flags import (
    DEFAULT_ONLINE_GROUP_SIZE,
    DEFAULT_ONLINE_GROUP_WINDOW_S,
    DEFAULT_ONLINE_GROUPING,
    ONLINE_GROUPINGS,
)

GROUP = "x-areal-group"  # the request header that names a group (and the response's echo)
BODY_FIELD = "areal_group"  # in the body's ``metadata``
NAME_MAX = 128
NAMED = "online:"  # metadata["group"] of a named group: NAMED + the client's name
DEFAULT = "online~"  # ... of a default one (no name starts the key with it)


def named_group(request: web.Request, body: dict[str, Any]) -> str | None:
    """The group a call names (header or body), checked; ``None`` when it names none.

    A bad name is a 400 (rendered in the route's own error schema by the middleware), and so is
    a call whose header and body name different groups."""
    header = request.headers.get(GROUP, "").strip()
    from_header = _checked(header, f"the {GROUP} header", None) if header else None
    metadata = body.get("metadata")
    from_body = None
    if isinstance(metadata, dict) and metadata.get(BODY_FIELD) is not None:
        param = f"metadata.{BODY_FIELD}"
        from_body = _checked(metadata[BODY_FIELD], param, param)
    if from_header and from_body and from_header != from_body:
        raise GatewayError(
            400,
            f"the {GROUP} header names group {from_header!r} but metadata.{BODY_FIELD} names "
            f"{from_body!r}: name one group (either place will do)",
            param=f"metadata.{BODY_FIELD}",
            code="invalid_group",
        )
    return from_header or from_body


def _checked(value: Any, where: str, param: str | None) -> str:
    if (
        isinstance(value, str)
        and 0 < len(value) <= NAME_MAX
        and value.isascii()
        and value.isprintable()
        and not any(c.isspace() for c in value)
    ):
        return value
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    raise GatewayError(
        400,
        f"{where} must name a group: 1 to {NAME_MAX} printable ASCII characters without spaces, "
        f"got {shown}",
        param=param,
        code="invalid_group",
    )


def prompt_digest(body: dict[str, Any]) -> str | None:
    """A short digest of a call's first user message, alike in every protocol: chat completions'
    and Anthropic's ``messages``, Responses' ``input`` (a string, or items). Text parts count by
    their text, so ``"hi"`` and ``[{"type": "text", "text": "hi"}]`` are one prompt."""
    first = _first_user_content(body)
    if first is None:
        return None
    if isinstance(first, list) and all(
        isinstance(p, dict) and isinstance(p.get("text"), str) for p in first
    ):
        first = "".join(p["text"] for p in first)
    text = first if isinstance(first, str) else json.dumps(first, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _first_user_content(body: dict[str, Any]) -> Any:
    given = body.get("input")
    if isinstance(given, str):
        return given
    items = body.get("messages", given)
    for item in items if isinstance(items, list) else ():
        if isinstance(item, dict) and item.get("role") == "user":
            return item.get("content")
    return None


@dataclass
class _Filling:
    """The default group that takes members now in one scope (the pool, or one prompt)."""

    key: str
    started: float  # on the rule's clock
    members: int = 0


class DefaultGroups:
    """``--online-grouping``: the group of a conversation that named none, given when it is
    handed to the trainer (module docstring). A group takes members until it has ``size`` or
    ``window`` seconds of ``clock`` have passed since its first; then the next one starts."""

    def __init__(
        self,
        grouping: str = DEFAULT_ONLINE_GROUPING,
        *,
        window: float = DEFAULT_ONLINE_GROUP_WINDOW_S,
        size: int = DEFAULT_ONLINE_GROUP_SIZE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if grouping not in ONLINE_GROUPINGS:
            raise ValueError(f"grouping must be one of {', '.join(ONLINE_GROUPINGS)}: {grouping!r}")
        if window <= 0 or size < 1:
            raise ValueError(f"a default group needs window > 0 and size >= 1: {window}, {size}")
        self.grouping = grouping
        self.window = window
        self.size = size
        self.clock = clock
        # Keys stay unique across gateway restarts: a trainer may still buffer an old group.
        self._boot = secrets.token_hex(3)
        self._made = 0
        self._filling: OrderedDict[str, _Filling] = OrderedDict()  # by scope, oldest first

    @property
    def wants_prompt(self) -> bool:
        """Whether :meth:`assign` reads the first user message (its digest is kept only then)."""
        return self.grouping == "prompt"

    def assign(self, prompt: str | None = None) -> str | None:
        """The group key of one more conversation handed to the trainer (``None``: alone);
        ``prompt``: its :func:`prompt_digest` (``prompt`` grouping; without one, the pool)."""
        if self.grouping == "none":
            return None
        scope = f"prompt-{prompt}" if self.grouping == "prompt" and prompt else "pool"
        now = self.clock()
        while self._filling:  # the groups past their window take no one again
            oldest = next(iter(self._filling.values()))
            if now - oldest.started < self.window:
                break
            self._filling.popitem(last=False)
        group = self._filling.get(scope)
        if group is None or group.members >= self.size:
            self._made += 1
            group = _Filling(f"{DEFAULT}{scope}-{self._boot}-{self._made}", now)
            self._filling.pop(scope, None)
            self._filling[scope] = group  # the newest last: the window order holds
        group.members += 1
        return group.key
