"""Serving an aiohttp application on a thread of its own (one HTTP stack for the whole project).

The embedded engine wants the process's main thread for torch, so its HTTP side runs here; tests
use the same class to start real servers on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from aiohttp import web


class ServerThread:
    """An aiohttp app on its own event loop and thread. ``start`` raises if the port cannot be bound."""

    def __init__(
        self,
        app: web.Application,
        host: str = "127.0.0.1",
        port: int = 0,
        shutdown_timeout: float = 5.0,
        handler_cancellation: bool = False,
    ) -> None:
        self.app = app
        # True: a handler is cancelled when its client disconnects (aiohttp's default is to let
        # it run on); for a server whose handlers hold up costly work for the client alone.
        self.handler_cancellation = handler_cancellation
        self.host = host
        self.port = port
        self.shutdown_timeout = shutdown_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The server's event loop while it runs (for ``asyncio.run_coroutine_threadsafe``)."""
        return self._loop

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread = threading.Thread(target=self._run, name="areal-http", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise TimeoutError(
                f"the HTTP server on {self.host}:{self.port} did not start in {timeout}s"
            )
        if self._error is not None:
            raise self._error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Close the listener and the open requests (within ``shutdown_timeout``), then the loop."""
        loop, runner = self._loop, self._runner
        if loop is not None and loop.is_running():
            if runner is not None:
                done = asyncio.run_coroutine_threadsafe(runner.cleanup(), loop)
                with contextlib.suppress(Exception):
                    done.result(timeout)
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        # asyncio's own loop for a server on a thread beside other work; a server with a process
        # of its own (the gateway) runs uvloop there (areal.host.event_loop).
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        runner = web.AppRunner(
            self.app,
            handle_signals=False,
            access_log=None,
            shutdown_timeout=self.shutdown_timeout,
            handler_cancellation=self.handler_cancellation,
        )
        try:
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, self.host, self.port)
            loop.run_until_complete(site.start())
            if self.port == 0:
                self.port = runner.addresses[0][1]
        except BaseException as exc:  # bind errors surface in start()
            self._error = exc
            self._started.set()
            loop.run_until_complete(runner.cleanup())
            loop.close()
            return
        self._runner = runner
        self._started.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
