"""Suite-wide settings: offline Hugging Face, small thread pools (the CI box has 2 cores), and
the fixtures that run the real SGLang package from its own venv."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")


# --- the real SGLang package, in the venv `make setup` builds beside this one -----------------

SGLANG_PROBE = Path(__file__).parent / "sglang" / "probe.py"


def sglang_python() -> Path:
    """The SGLang venv's interpreter (``$AREAL_SGLANG_PYTHON`` overrides); fails, never skips."""
    override = os.environ.get("AREAL_SGLANG_PYTHON")
    python = Path(override) if override else Path(sys.prefix) / "sglang" / "bin" / "python"
    if not python.exists():
        pytest.fail(
            f"no SGLang venv at {python}: `make setup` builds it (.venv/sglang, SGLang's "
            "Python package beside CPU torch); AREAL_SGLANG_PYTHON names another interpreter",
            pytrace=False,
        )
    return python


def sglang_env() -> dict[str, str]:
    """This environment without PYTHONPATH: areal's source must not shadow SGLang's venv."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.fixture(scope="session")
def sglang_probe() -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Runs ``tests/sglang/probe.py`` in the SGLang venv on one batch (SGLang imports slowly)."""
    python = sglang_python()

    def probe(job: dict[str, Any]) -> dict[str, Any]:
        result = subprocess.run(
            [str(python), str(SGLANG_PROBE)],
            input=json.dumps(job),
            capture_output=True,
            text=True,
            env=sglang_env(),
            timeout=240,
        )
        assert result.returncode == 0, f"the SGLang probe failed:\n{result.stderr[-4000:]}"
        answer: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
        return answer

    return probe


@pytest.fixture(scope="session")
def sglang_venv_python() -> Path:
    return sglang_python()


@pytest.fixture(name="sglang_env", scope="session")
def _sglang_env() -> Callable[[], dict[str, str]]:
    return sglang_env
