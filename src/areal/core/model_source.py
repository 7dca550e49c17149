"""Where a model's files are: a local directory as it is, a Hugging Face Hub id as a local snapshot.

``model.path: Qwen/Qwen2.5-7B-Instruct`` (optionally ``org/name@revision``: a branch, tag or
commit) is resolved the way transformers, vLLM and SGLang do it: ``huggingface_hub``'s
``snapshot_download`` into the standard cache (``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``~/.cache/huggingface/hub``), nothing downloaded when ``HF_HUB_OFFLINE`` is set. The run driver
does it once, before anything starts (:func:`resolve_models`), so the trainer and every engine
read the same snapshot directory. The environment is read at each call, not at import, so a
process that changes ``HF_HOME`` or ``HF_HUB_OFFLINE`` gets what it set. Every failure is a
:class:`ModelSourceError` naming the config key, the repo and the fix. Torch-free;
``huggingface_hub`` is imported only when a Hub id is resolved.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from areal.core.config import ConfigError

if TYPE_CHECKING:
    from areal.core.run_config import RunConfig

log = logging.getLogger("areal.model")

__all__ = [
    "HubId",
    "ModelSourceError",
    "cached_model",
    "hub_cache_dir",
    "hub_id",
    "is_offline",
    "resolve_model",
    "resolve_models",
]

# Weights areal never loads (its loaders and the engines read safetensors): not downloaded.
IGNORE_PATTERNS = ["*.bin", "*.pt", "*.pth", "*.h5", "*.msgpack", "*.ckpt", "*.onnx", "*.gguf"]
_TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's ENV_VARS_TRUE_VALUES


class ModelSourceError(ConfigError):
    """A model path that is neither a local directory nor a Hub model this machine can get."""


@dataclass(frozen=True)
class HubId:
    """A Hugging Face Hub model id and the revision asked for (``None``: the default branch)."""

    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


def hub_id(spec: str) -> HubId | None:
    """``org/name`` or ``org/name@revision`` as huggingface_hub's ``validate_repo_id`` accepts
    it; ``None`` for anything else (an absolute path, ``./dir``, ``a/b/c``)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    repo, _, revision = spec.partition("@")
    if "@" in spec and not revision:
        return None
    try:
        validate_repo_id(repo)
    except HFValidationError:
        return None
    return HubId(repo, revision or None)


def is_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) now, or as huggingface_hub read it at
    import (it then refuses the network whatever the environment says later)."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    if value.strip().upper() in _TRUE:
        return True
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def hub_cache_dir() -> str:
    """The hub cache by huggingface_hub's own rules, read from the environment now."""
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "huggingface",
    )
    cache = (
        os.environ.get("HF_HUB_CACHE")
        or os.environ.get("HUGGINGFACE_HUB_CACHE")
        or os.path.join(home, "hub")
    )
    return os.path.expandvars(os.path.expanduser(cache))


def resolve_model(spec: str, *, key: str = "model.path") -> str:
    """A local directory as it is; a Hub id as its snapshot directory (downloaded if missing and
    online). Raises :class:`ModelSourceError` naming ``key`` and the fix."""
    path = Path(spec)
    if path.is_dir():
        return spec
    if path.exists():
        raise ModelSourceError(f"{key}: {spec} is a file; point {key} at a checkpoint directory")
    ident = hub_id(spec)
    if ident is None:
        raise ModelSourceError(
            f"{key}: {spec!r} is neither a local directory nor a Hugging Face Hub id "
            f"(org/name, optionally @revision); point {key} at a checkpoint directory "
            f"(config.json and *.safetensors, Hugging Face layout), create "
            f"one with `areal model init-tiny DIR`, or give a Hub id such as Qwen/Qwen3-0.6B"
        )
    return _snapshot(ident, key=key, spec=spec, offline=is_offline())


def cached_model(spec: str) -> str | None:
    """The snapshot directory of a Hub id already in the cache (no network), else ``None``."""
    ident = hub_id(spec)
    if ident is None:
        return None
    try:
        return _snapshot(ident, key="", spec=spec, offline=True)
    except ModelSourceError:
        return None


def resolve_models(config: RunConfig) -> RunConfig:
    """``config`` with ``model.path`` and ``model.tokenizer`` as local directories (the run
    driver calls this once, before anything starts). With ``model.init_tiny`` the path is where
    the tiny model is made, so it stays as written."""
    model = config.model
    update: dict[str, str] = {}
    if model.init_tiny is None:
        update["path"] = resolve_model(model.path, key="model.path")
    if model.tokenizer is not None:
        update["tokenizer"] = resolve_model(model.tokenizer, key="model.tokenizer")
    changed = {name: local for name, local in update.items() if local != getattr(model, name)}
    for name, local in changed.items():
        log.info("model.%s %s is the snapshot %s", name, getattr(model, name), local)
    if not changed:
        return config
    return config.model_copy(update={"model": model.model_copy(update=changed)})


def _snapshot(ident: HubId, *, key: str, spec: str, offline: bool) -> str:
    """``snapshot_download`` with every failure turned into one :class:`ModelSourceError`."""
    from huggingface_hub import errors, snapshot_download

    cache = hub_cache_dir()
    repo = ident.repo_id
    get = f"`hf download {repo}` (or `huggingface-cli download {repo}`)"
    if ident.revision:
        get = f"`hf download {repo} --revision {ident.revision}`"
    local = f"or point {key} at a local checkpoint directory"
    incomplete = getattr(errors, "IncompleteSnapshotError", None)
    try:
        folder: str = snapshot_download(
            repo,
            revision=ident.revision,
            cache_dir=cache,
            local_files_only=offline,
            ignore_patterns=IGNORE_PATTERNS,
        )
    except errors.RevisionNotFoundError:
        raise ModelSourceError(
            f"{key}: the Hugging Face Hub model {repo} has no revision {ident.revision!r}; "
            f"name an existing branch, tag or commit after @, {local}"
        ) from None
    except errors.RepositoryNotFoundError:
        raise ModelSourceError(
            f"{key}: {spec} is not a local directory, and the Hugging Face Hub has no model "
            f"{repo} this machine may read (for a private or gated model, log in with "
            f"`hf auth login` or set HF_TOKEN); fix the id, {local}"
        ) from None
    except errors.LocalEntryNotFoundError as err:
        if incomplete is not None and isinstance(err, incomplete):
            raise ModelSourceError(
                f"{key}: the cached snapshot of the Hugging Face Hub model {ident} in {cache} is "
                f"incomplete; finish it with {get} on a machine with internet, {local}"
            ) from None
        if offline:
            raise ModelSourceError(
                f"{key}: {spec} is not a local directory, and the Hugging Face Hub model {ident} "
                f"is not in the cache {cache} while HF_HUB_OFFLINE is set (nothing is "
                f"downloaded); download it with {get} on a machine with internet into that "
                f"cache (HF_HOME / HF_HUB_CACHE), unset HF_HUB_OFFLINE to download it now, {local}"
            ) from None
        raise ModelSourceError(
            f"{key}: the Hugging Face Hub is unreachable ({_cause(err)}) and the model {ident} "
            f"is not in the cache {cache}; check the network (or HF_ENDPOINT, the proxy), "
            f"download it with {get} on a machine with internet, {local}"
        ) from None
    except errors.HfHubHTTPError as err:
        raise ModelSourceError(
            f"{key}: downloading the Hugging Face Hub model {ident} failed ({_cause(err)}); "
            f"try again, download it with {get}, {local}"
        ) from None
    except OSError as err:  # a full disk, an unwritable cache, a dropped connection mid-file
        raise ModelSourceError(
            f"{key}: downloading the Hugging Face Hub model {ident} into {cache} failed "
            f"({type(err).__name__}: {err}); fix the cache (HF_HOME / HF_HUB_CACHE), {local}"
        ) from None
    except Exception as err:  # the HTTP client's own errors (a proxy's, a protocol's)
        raise ModelSourceError(
            f"{key}: the Hugging Face Hub could not be reached for {ident} ({_cause(err)}); "
            f"check the network (or HF_ENDPOINT, the proxy), download it with {get}, {local}"
        ) from None
    return folder


def _cause(err: BaseException) -> str:
    """The first line of the error underneath (the connection's, not huggingface_hub's advice)."""
    inner = err.__cause__ or err.__context__ or err
    text = str(inner).strip().splitlines()
    return f"{type(inner).__name__}: {text[0]}" if text else type(inner).__name__
