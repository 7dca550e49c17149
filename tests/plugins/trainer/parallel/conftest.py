"""One real multi-process launch per world size, shared by the tests of this directory."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("dist_worker.py")


@pytest.fixture(scope="session")
def launch(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], Path]:
    """``launch(world)`` runs ``dist_worker.py`` with ``world`` gloo ranks once per session and
    returns its output directory; a failed rank fails the test with its traceback."""
    done: dict[int, Path] = {}

    def run(world: int) -> Path:
        if world not in done:
            out = tmp_path_factory.mktemp(f"world{world}")
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
            proc = subprocess.run(
                [sys.executable, str(WORKER), str(world), str(out)],
                capture_output=True,
                text=True,
                timeout=240,
                env=env,
            )
            errors = sorted(out.glob("error-rank*.json"))
            if proc.returncode or errors:
                detail = errors[0].read_text() if errors else proc.stderr[-4000:]
                pytest.fail(f"{world}-rank launch failed (rc {proc.returncode}):\n{detail}")
            done[world] = out
        return done[world]

    return run
