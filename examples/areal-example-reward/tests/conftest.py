"""Test the package as installed, or straight from ``src/`` when it is not (a fresh checkout, or
the areal repository's own test run)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("areal_example_reward") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
