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


def key_path(parts: Collection[Any]) -> str:
    """``train.parallelism.dp``; a key that would not print as itself on one line (a control
    character, a line break, a tab) is shown as its repr."""
    return ".".join(str(p) if str(p).isprintable() else repr(p) for p in parts)


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
            k: substitute_env(
                v, f"{where}.{key_path([k])}" if where else key_path([k]), used, optional
            )
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
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{path} is not UTF-8 text (byte {err.start} is {err.object[err.start : err.start + 1]!r}); "
            "save the config as UTF-8 YAML"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {yaml_problem(err)}") from None
    except RecursionError:  # PyYAML's composer recurses once per level of nesting
        raise ConfigError(f"{path} is nested too deeply to be a config") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path} must hold a mapping at the top level (key: value lines), "
            f"not a {_yaml_kind(data)}"
        )
    try:
        return dict(substitute_env(data, used=used, optional=optional))
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def yaml_problem(err: yaml.YAMLError) -> str:
    """PyYAML's error in one line: where (line and column, 1-based) and what."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    problem, context = getattr(err, "problem", None), getattr(err, "context", None)
    what = str(problem or context or str(err).strip() or type(err).__name__)
    if problem and context:
        what += f" ({context})"
    what = " ".join(what.split())
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}{what}; fix the YAML there"


def _yaml_kind(value: Any) -> str:
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    return type(value).__name__


def describe_errors(err: ValidationError) -> str:
    """One ``key: why`` per problem, on one line; a validator's message that already names its
    full key path (``model_routing.critic.top_p: ...``) is shown as it is."""
    parts = []
    for e in err.errors():
        loc = key_path(e["loc"])
        msg = "unknown key (check its spelling)" if e["type"] == "extra_forbidden" else e["msg"]
        msg = msg.removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc and not msg.startswith(f"{loc}.") else msg)
    return "; ".join(" ".join(part.split()) for part in parts)
