"""The run's tests share one way to serve a model: the embedded engine's real HTTP server on
127.0.0.1, in a thread of the test process."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from areal.core.http_server import ServerThread
from areal.plugins.inference.embedded.server import build_server


@contextlib.contextmanager
def _serve(model_dir: str, **options: Any) -> Iterator[str]:
    server = build_server(model_dir, max_total_tokens=4096, **options)
    http = ServerThread(server.app(), "127.0.0.1", 0).start()
    try:
        yield http.url
    finally:
        server.engine.stop()
        http.stop()


@pytest.fixture(scope="session")
def serve_embedded() -> Callable[..., contextlib.AbstractContextManager[str]]:
    """``with serve_embedded(model_dir) as url:`` an embedded engine serving ``model_dir``."""
    return _serve
