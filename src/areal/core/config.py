"""Configuration files: YAML with ``${ENV}`` substitution, validated by pydantic.

Errors name the key and say how to fix it. The two schemas built on these helpers live with their
readers: the run config in :mod:`areal.core.run_config`, the router config in
:mod:`areal.gateway.router_config`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

ENV_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file, the key and the fix."""


def substitute_env(
    value: Any,
    where: str = "",
    used: dict[str, list[str]] | None = None,
    optional: Collection[str] = (),
) -> Any:
    """Replace ``${VAR}`` (or ``${VAR:-default}``) in every string of a parsed YAML document.

    ``used`` collects the variable names found at each key path (``api_gateway.api_key`` ->
    ``["TAOTOKEN_API_KEY"]``), so later errors can say which variable holds a bad value. A key
    path in ``optional`` whose variable is unset becomes ``None`` instead of an error (its reader
    says what that means).
    """
    if isinstance(value, dict):
        return {
            k: substitute_env(v, f"{where}.{k}" if where else str(k), used, optional)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [substitute_env(v, f"{where}[{i}]", used, optional) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if used is not None:
            used.setdefault(where, []).append(name)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise ConfigError(f"{where}: environment variable {name} is not set (export {name}=...)")

    try:
        return ENV_PATTERN.sub(replace, value)
    except ConfigError:
        if where in optional:
            return None
        raise


def load_yaml(
    path: str | Path,
    used: dict[str, list[str]] | None = None,
    optional: Collection[str] = (),
) -> dict[str, Any]:
    """A YAML mapping with ``${ENV}`` substituted (see :func:`substitute_env` for ``used`` and
    ``optional``)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping at the top level")
    try:
        return dict(substitute_env(data, used=used, optional=optional))
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def describe_errors(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = "unknown key (check its spelling)" if e["type"] == "extra_forbidden" else e["msg"]
        msg = msg.removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)
