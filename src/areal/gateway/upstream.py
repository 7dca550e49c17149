"""The unified API channel: every non-policy model id goes to the upstream (filled in by the
gateway issue)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from areal.core.config import ApiGatewayConfig, ModelRouting


class UpstreamChannel:
    def __init__(self, config: ApiGatewayConfig, routing: ModelRouting) -> None:
        self.config = config
        self.routing = routing

    async def forward(
        self, request: web.Request, body: dict[str, Any], path: str
    ) -> web.StreamResponse:
        """Send ``body`` (with the model's defaults and caps) to the upstream's ``path``."""
        raise NotImplementedError

    async def close(self) -> None:
        """Release connections."""
