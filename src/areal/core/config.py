"""Configuration files: YAML with ``${ENV}`` substitution, validated by pydantic.

Errors name the key and say how to fix it. The router config is the seed article's
``api_gateway`` + ``model_routing`` YAML, accepted as written.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file, the key and the fix."""


def substitute_env(value: Any, where: str = "") -> Any:
    """Replace ``${VAR}`` (or ``${VAR:-default}``) in every string of a parsed YAML document."""
    if isinstance(value, dict):
        return {k: substitute_env(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute_env(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise ConfigError(f"{where}: environment variable {name} is not set (export {name}=...)")

    return _ENV.sub(replace, value)


def load_yaml(path: str | Path) -> dict[str, Any]:
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
        return dict(substitute_env(data))
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def describe_errors(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = "unknown key (check its spelling)" if e["type"] == "extra_forbidden" else e["msg"]
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


# --- the router config (gateway) ------------------------------------------------------------


class ApiGatewayConfig(BaseModel):
    """The upstream channel every non-policy model id is forwarded to (OpenAI-compatible)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str
    api_key: str | None = Field(default=None, repr=False)
    timeout: float = Field(60.0, gt=0)
    max_retries: int = Field(3, ge=0, le=20)


class ModelRoute(BaseModel):
    """Defaults for one model id; ``max_tokens`` also caps what a client asks for."""

    model_config = ConfigDict(extra="forbid")

    model_id: str
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, gt=0)


class ModelRouting(BaseModel):
    model_config = ConfigDict(extra="allow")  # more named roles (critic_model, ...) are routes too

    policy_model: ModelRoute = ModelRoute(model_id="policy")
    reward_model: ModelRoute | None = None
    judge_model: ModelRoute | None = None

    def routes(self) -> dict[str, ModelRoute]:
        """Every configured route by model id."""
        found: dict[str, ModelRoute] = {}
        for name in ("policy_model", "reward_model", "judge_model", *(self.model_extra or {})):
            value = getattr(self, name, None)
            if value is None and self.model_extra:
                value = self.model_extra.get(name)
            if isinstance(value, dict):
                value = ModelRoute.model_validate(value)
            if isinstance(value, ModelRoute):
                found[value.model_id] = value
        return found


class RouterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    api_gateway: ApiGatewayConfig | None = None
    model_routing: ModelRouting = ModelRouting()

    @property
    def policy(self) -> ModelRoute:
        return self.model_routing.policy_model

    @classmethod
    def load(cls, path: str | Path) -> RouterConfig:
        data = load_yaml(path)
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise ConfigError(f"{path}: {describe_errors(err)}") from None
