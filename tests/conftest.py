"""Suite-wide settings: offline Hugging Face, small thread pools (the CI box has 2 cores); a
Hugging Face cache holding areal's nano model as a downloaded Hub model; and the fixtures that run
the real SGLang package from its own venv."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")


@dataclass(frozen=True)
class HubModel:
    """areal's nano model as the Hugging Face cache holds a downloaded Hub model."""

    repo_id: str
    cache: Path  # $HF_HOME/hub
    main: Path  # snapshots/<commit of refs/main>
    tagged: Path  # snapshots/<commit of refs/v1>
    tagged_commit: str


@pytest.fixture(scope="session")
def hub_source_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from areal.plugins.models.tiny import init_tiny

    path = tmp_path_factory.mktemp("nano") / "model"
    init_tiny(path, size="nano", seed=0)
    return path


def _snapshot(repo: Path, commit: str, files: Path) -> Path:
    """snapshots/<commit>/<file> as relative symlinks into blobs/<sha256>, as hf_hub writes."""
    snapshot = repo / "snapshots" / commit
    for item in sorted(p for p in files.rglob("*") if p.is_file()):
        data = item.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / item.relative_to(files)
        link.parent.mkdir(parents=True, exist_ok=True)
        depth = len(item.relative_to(files).parts) + 1  # snapshots/<commit>/<file>
        link.symlink_to(Path("../" * depth) / "blobs" / blob.name)
    return snapshot


@pytest.fixture
def hub_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hub_source_dir: Path) -> HubModel:
    """``areal-test/nano`` in a fresh ``HF_HOME`` (``refs/main`` and a ``v1`` tag on another
    commit), with ``HF_HUB_OFFLINE=1``: what a machine that downloaded it before has."""
    home = tmp_path / "hf-home"
    repo = home / "hub" / "models--areal-test--nano"
    main, tagged = (hashlib.sha1(name.encode()).hexdigest() for name in ("main", "v1"))
    main_dir = _snapshot(repo, main, hub_source_dir)
    tagged_dir = _snapshot(repo, tagged, hub_source_dir)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(main)
    (repo / "refs" / "v1").write_text(tagged)
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return HubModel("areal-test/nano", home / "hub", main_dir, tagged_dir, tagged)


# --- the real SGLang package, in the venv `make setup` builds beside this one -----------------

SGLANG_PROBE = Path(__file__).parent / "in_sglang_venv" / "probe.py"


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
    """Runs ``tests/in_sglang_venv/probe.py`` in the SGLang venv on one batch (SGLang imports slowly)."""
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


# The one hypothesis profile of the fuzz suites: the same cases on every run (CI is reproducible),
# no example database, no deadline for real servers, none of the health checks a server trips.
settings.register_profile(
    "areal-fuzz",
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.large_base_example,
        HealthCheck.function_scoped_fixture,
    ],
)


# Only a GPU may be missing under CI, and every run ends with its skips (tests/support/skips.py).
from support.skips import (  # noqa: E402, F401 - hooks, found here by pytest
    pytest_runtest_logreport,
    pytest_runtest_makereport,
    pytest_terminal_summary,
)
