"""An engine joining a running gateway for its lifetime (``areal serve inference --attach``).

Once the engine answers ``/health``, it is attached (``POST /rl/engines``): the gateway makes it
load the newest published weights first, then routes calls to it. On SIGTERM/SIGINT it is
detached with a drain (its running calls finish, up to ``drain_timeout``), and only then does the
engine stop, so no call it had is lost. If the gateway cannot be reached or refuses, the engine
stops and the exit code is 1. The work runs on a thread of its own: the engine loop holds the
main thread (see :mod:`areal.core.serve_hooks`).
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

import aiohttp

from areal.run.gateway_client import GatewayAdmin, GatewayAdminError, GatewayRefused

ADMIN_TOKEN_ENV = "AREAL_ADMIN_TOKEN"
HEALTHY_TIMEOUT_S = 600.0  # a big checkpoint takes a while to load
HEALTH_EVERY_S = 0.2


class GatewayAttachment:
    """:class:`~areal.core.serve_hooks.ServeHooks` that attach the engine to ``gateway_url``.

    ``engine_url``: the URL the gateway reaches the engine at (default: the one it serves on).
    After the engine has stopped, :meth:`finish` waits for the detach and gives the exit code.
    """

    def __init__(
        self,
        gateway_url: str,
        admin_token: str,
        *,
        engine_url: str | None = None,
        backend: str | None = None,
        owner: str | None = None,
        drain_timeout: float = 30.0,
        healthy_timeout: float = HEALTHY_TIMEOUT_S,
        out: TextIO | None = None,
        err: TextIO | None = None,
    ) -> None:
        self.admin = GatewayAdmin(gateway_url, admin_token)
        self.engine_url = engine_url.rstrip("/") if engine_url else None
        self.backend = backend
        self.owner = owner or default_owner()
        self.drain_timeout = drain_timeout
        self.healthy_timeout = healthy_timeout
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self.exit_code = 0
        self._stop_asked = threading.Event()
        self._stop: Callable[[], None] | None = None
        self._thread: threading.Thread | None = None

    # --- ServeHooks ---------------------------------------------------------------------------

    def serving(self, url: str, stop: Callable[[], None]) -> None:
        self.engine_url = self.engine_url or url
        self._stop = stop
        self._thread = threading.Thread(target=self._run, name="areal-attach", daemon=True)
        self._thread.start()

    def signalled(self) -> None:
        """The first signal detaches then stops; a second one stops at once."""
        if self._stop_asked.is_set() and self._stop is not None:
            self._stop()
        self._stop_asked.set()

    # --- after the engine stopped -------------------------------------------------------------

    def finish(self, timeout: float | None = None) -> int:
        """Detach if still attached (the engine ended on its own), then the exit code."""
        self._stop_asked.set()
        if self._thread is not None:
            self._thread.join(self.drain_timeout + 30.0 if timeout is None else timeout)
        return self.exit_code

    # --- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            asyncio.run(self._lifetime())
        finally:
            if self._stop is not None:
                self._stop()

    async def _lifetime(self) -> None:
        assert self.engine_url is not None
        if not await self._healthy(self.engine_url):
            return
        try:
            entry = await self.admin.attach_engine(
                self.engine_url, backend=self.backend, owner=self.owner
            )
        except GatewayAdminError as error:
            self._fail(f"error: could not attach {self.engine_url}: {error}")
            return
        self._say(
            f"attached {self.engine_url} to the gateway at {self.admin.url}, "
            f"serving weights version {entry.get('weight_version')}"
        )
        await asyncio.to_thread(self._stop_asked.wait)
        try:
            gone = await self.admin.detach_engine(
                self.engine_url, drain=True, timeout=self.drain_timeout
            )
        except GatewayRefused as error:
            if error.status != 404:
                self._fail(f"error: could not detach {self.engine_url}: {error}")
            else:  # detached by someone else meanwhile: nothing left to do
                self._say(f"{self.engine_url} was no longer attached to {self.admin.url}")
            return
        except GatewayAdminError as error:
            self._fail(f"error: could not detach {self.engine_url}: {error}")
            return
        self._say(
            f"detached {self.engine_url} from the gateway at {self.admin.url} "
            f"({gone['finished']} running calls finished, {gone['aborted']} aborted)"
        )

    async def _healthy(self, url: str) -> bool:
        """Wait for the engine's ``/health``; ``False`` if asked to stop (or it never answers)."""
        deadline = time.monotonic() + self.healthy_timeout
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while not self._stop_asked.is_set():
                try:
                    async with http.get(f"{url}/health") as answer:
                        if answer.status == 200:
                            return True
                except (aiohttp.ClientError, TimeoutError):
                    pass
                if time.monotonic() > deadline:
                    self._fail(
                        f"error: the engine at {url} did not answer /health within "
                        f"{self.healthy_timeout:g}s, so it was not attached"
                    )
                    return False
                await asyncio.sleep(HEALTH_EVERY_S)
        return False

    def _say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def _fail(self, line: str) -> None:
        self.exit_code = 1
        print(line, file=self.err, flush=True)


def default_owner() -> str:
    """Who attached the engine, as ``GET /rl/engines`` shows it."""
    return f"areal serve inference on {socket.gethostname()} (pid {os.getpid()})"
