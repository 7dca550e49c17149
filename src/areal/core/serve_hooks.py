"""What an engine server lets its launcher do around its lifetime, without knowing what it is.

``areal serve inference --attach`` joins a running gateway once the engine answers and leaves it
(draining) before the engine stops. The engine server only calls these hooks; the gateway side
lives in :mod:`areal.run.engine_attach`, so the engine plugin imports nothing of the run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class ServeHooks(Protocol):
    """Called by an engine server (e.g. the embedded engine's ``serve``)."""

    def serving(self, url: str, stop: Callable[[], None]) -> None:
        """HTTP listens at ``url`` and the engine is about to run. Must not block (the engine
        loop may need the calling thread); ``stop`` ends the engine from any thread."""

    def signalled(self) -> None:
        """SIGTERM or SIGINT arrived: instead of stopping at once, the hooks call ``stop`` when
        they are done (e.g. after leaving the gateway). Must not block."""
