"""The fault tests' helper (``gateway_kill.py``, also a script for hand measurements), loaded by
path: the test folders are not packages."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="session")
def gateway_kill() -> ModuleType:
    path = Path(__file__).with_name("gateway_kill.py")
    spec = importlib.util.spec_from_file_location("areal_tests_gateway_kill", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module
