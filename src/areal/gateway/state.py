"""The gateway's state, shared by every route: the router config, the policy service, the
sessions, the keys, the upstream channel and the access log. Front ends reach it with
:func:`state_of`; :mod:`.app` puts it on the application."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from areal.gateway.access_log import AccessLog
from areal.gateway.policy import Generation, PolicyService
from areal.gateway.request import CALLER
from areal.gateway.router_config import RouterConfig
from areal.gateway.sessions import SessionManager


@dataclass
class GatewayState:
    config: RouterConfig
    policy: PolicyService
    sessions: SessionManager
    gateway_key: str = field(repr=False)
    admin_token: str | None = field(default=None, repr=False)
    upstream: Any = None  # areal.gateway.upstream.UpstreamChannel when api_gateway is configured
    access_log: AccessLog = field(default_factory=lambda: AccessLog(None))

    def __post_init__(self) -> None:
        # A driver-chosen session key must never be one of the gateway's own keys.
        self.sessions.reserved_keys = {k for k in (self.gateway_key, self.admin_token) if k}

    async def record(self, request: web.Request, generation: Generation) -> str | None:
        """Record a finished policy completion into the caller's session, if it has one."""
        caller = request[CALLER]
        if caller.session is None:
            return None
        return await self.sessions.record(
            caller.session, model=self.policy.model_id, generation=generation
        )


STATE = web.AppKey("state", GatewayState)


def state_of(request: web.Request) -> GatewayState:
    return request.app[STATE]
