"""Fixtures for the inference tests: the real embedded server on 127.0.0.1 (uvicorn in a thread)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from areal.plugins.models.tiny import init_tiny
from support.engines import RunningServer, perturbed_model, running_server


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


@pytest.fixture
def perturbed() -> Callable[..., Any]:
    """:func:`support.engines.perturbed_model`, as a fixture."""
    return perturbed_model


@pytest.fixture(scope="session")
def reference_model(nano_model_dir: str) -> Any:
    from areal.plugins.models.hf_io import load_model

    return load_model(Path(nano_model_dir))
