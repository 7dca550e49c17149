"""Fixtures for the inference tests: the real embedded server on 127.0.0.1 (uvicorn in a thread)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from areal.plugins.inference.embedded.server import InferenceServer, build_server
from areal.plugins.inference.server_process import pick_free_port
from areal.plugins.models.tiny import init_tiny


@dataclass
class RunningServer:
    url: str
    server: InferenceServer
    http: httpx.Client

    def generate(self, **body: Any) -> Any:
        resp = self.http.post("/generate", json=body)
        assert resp.status_code == 200, resp.text
        return resp.json()


@contextmanager
def running_server(model_dir: str, **options: Any) -> Iterator[RunningServer]:
    options.setdefault("max_total_tokens", 8192)
    server = build_server(model_dir, **options)
    port = pick_free_port()
    uv = uvicorn.Server(
        uvicorn.Config(server.app(), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=60) as http:
            yield RunningServer(url, server, http)
    finally:
        uv.should_exit = True
        thread.join(timeout=10)
        server.engine.stop()


@pytest.fixture(scope="session")
def nano_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The embedded default at its smallest size: a real Qwen3-style checkpoint and tokenizer."""
    path = tmp_path_factory.mktemp("nano") / "model"
    init_tiny(path, size="nano", seed=0)
    return str(path)


@pytest.fixture(scope="module")
def server(nano_model_dir: str) -> Iterator[RunningServer]:
    """A shared server for tests that do not change its state (no pause, no weight update)."""
    with running_server(nano_model_dir) as running:
        yield running


@pytest.fixture
def start_server(nano_model_dir: str) -> Callable[..., AbstractContextManager[RunningServer]]:
    """A private server with custom options, for tests that pause it or change its weights."""
    return lambda **options: running_server(options.pop("model_dir", nano_model_dir), **options)


@pytest.fixture(scope="session")
def reference_model(nano_model_dir: str) -> Any:
    from areal.plugins.models.hf_io import load_model

    return load_model(Path(nano_model_dir))
