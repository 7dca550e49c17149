"""Fixtures for the inference tests: the real embedded server on 127.0.0.1 (uvicorn in a thread)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from areal.plugins.inference.embedded.server import InferenceServer, build_server
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
    """The real app on 127.0.0.1 (aiohttp on a side thread), the engine on its own thread."""
    options.setdefault("max_total_tokens", 8192)
    server = build_server(model_dir, **options)
    http_server = server.http().start()
    try:
        with httpx.Client(base_url=http_server.url, timeout=60) as http:
            yield RunningServer(http_server.url, server, http)
    finally:
        server.engine.stop()
        http_server.stop()


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


def perturbed_model(
    model_dir: str, out: Path | None = None, scale: float = 0.05, seed: int | None = None
) -> Any:
    """The checkpoint with every weight moved a little: a stand-in for a trainer step's result.
    Saved to ``out`` (HF format) when given."""
    import torch

    from areal.plugins.models.hf_io import load_model, save_model

    model = load_model(model_dir)
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    if out is not None:
        save_model(model, out)
    return model


@pytest.fixture
def perturbed() -> Callable[..., Any]:
    """:func:`perturbed_model`, for tests (which cannot import this conftest by name)."""
    return perturbed_model


@pytest.fixture(scope="session")
def reference_model(nano_model_dir: str) -> Any:
    from areal.plugins.models.hf_io import load_model

    return load_model(Path(nano_model_dir))
