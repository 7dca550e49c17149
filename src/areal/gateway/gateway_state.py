"""The state one gateway serves from (config, policy, sessions, keys, online conversations),
reachable from a request."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from areal.gateway.access_log import AccessLog
from areal.gateway.callers import caller_of
from areal.gateway.online import OnlineConversations
from areal.gateway.policy import Generation, PolicyService
from areal.gateway.router_config import RouterConfig
from areal.gateway.sessions import SessionManager

if TYPE_CHECKING:
    from areal.gateway.trainer_seat import TrainerSeat
    from areal.gateway.upstream import UpstreamChannel


@dataclass
class GatewayState:
    config: RouterConfig
    policy: PolicyService
    sessions: SessionManager
    gateway_key: str = field(repr=False)
    admin_token: str | None = field(default=None, repr=False)
    upstream: UpstreamChannel | None = None  # when api_gateway is configured
    access_log: AccessLog = field(default_factory=lambda: AccessLog(None))
    trainer: TrainerSeat | None = None  # the run attached to this gateway (/rl/trainer)
    online: OnlineConversations | None = None  # --online: plain-key conversations are recorded

    async def record(self, request: web.Request, generation: Generation) -> str | None:
        """Record a finished policy completion into the caller's session, if it has one."""
        caller = caller_of(request)
        if caller.session is None:
            return None
        return await self.sessions.record(
            caller.session, model=self.policy.model_id, generation=generation
        )


STATE = web.AppKey("state", GatewayState)


def state_of(request: web.Request) -> GatewayState:
    return request.app[STATE]
