"""RL sessions: episode keys, the session API, and recording completions into trajectories.

(Interface in place; the issue on the gateway's recording fills it in.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from areal.gateway.policy import Generation


@dataclass
class Session:
    session_id: str
    api_key: str = field(repr=False)
    metadata: dict[str, Any] = field(default_factory=dict)


class SessionManager:
    """Owns the sessions of this gateway; ``lookup`` maps a key to its session."""

    def __init__(self, admin_token: str | None) -> None:
        self.admin_token = admin_token
        self._by_key: dict[str, Session] = {}

    def lookup(self, api_key: str) -> Session | None:
        return self._by_key.get(api_key)

    def hint(self, session_hint: str) -> Session | None:
        """A session named by a client's own grouping hint (used when no session key is given)."""
        return None

    async def record(self, session: Session, *, model: str, generation: Generation) -> str | None:
        """Record one finished completion of ``session``; returns its completion id."""
        return None

    def add_routes(self, app: web.Application, prefixes: tuple[str, ...]) -> None:
        """``/rl/sessions`` and friends (admin token)."""

    async def close(self) -> None:
        """Flush what is pending to the trajectory sink."""
