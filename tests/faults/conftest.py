"""The fault tests' helpers, loaded by path (the test folders are not packages):
``fault_run.py`` (``areal train`` with faults injected by signal) and ``gateway_kill.py`` (the
gateway's fault on top of it, also a script for hand measurements)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest


def _load(name: str) -> ModuleType:
    module_name = f"areal_tests_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def fault_run() -> ModuleType:
    return _load("fault_run")


@pytest.fixture(scope="session")
def gateway_kill() -> ModuleType:
    return _load("gateway_kill")
