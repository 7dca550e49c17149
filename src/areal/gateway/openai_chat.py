"""(Filled in by the gateway issue.)"""

from __future__ import annotations

from aiohttp import web


def add_routes(app: web.Application, prefixes: tuple[str, ...]) -> None:
    """Register this protocol's routes under each prefix."""
