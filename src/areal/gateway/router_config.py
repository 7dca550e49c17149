"""The router config: the seed article's ``api_gateway`` + ``model_routing`` YAML, accepted as
written. It says which model id is the policy (served by the local engines) and where every other
model id goes (the unified upstream channel); the gateway reads it, the run writes the policy's
sampling defaults into its copy."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from areal.core.config import (
    ENV_PATTERN,
    ConfigError,
    describe_errors,
    key_path,
    load_yaml,
    substitute_env,
)

KEY_PATH = "api_gateway.api_key"  # the one value that may read an unset variable


class ApiGatewayConfig(BaseModel):
    """The upstream channel every non-policy model id is forwarded to (OpenAI-compatible).

    ``api_key_env`` names the environment variable that holds the key, so an upstream that
    rejects it can be answered with "check TAOTOKEN_API_KEY" without ever showing the key. It is
    filled in from ``api_key: ${VAR}``; set it instead of ``api_key`` to read the key from there.
    An unset variable is no error here: the policy needs no key, so the gateway still serves it,
    and :attr:`unset_key_env` lets the channel answer its calls with what to export.

    Only the model ids ``model_routing`` lists are forwarded (the operator's key pays for them);
    ``allow_unlisted_models: true`` forwards any id, for a gateway meant as an open channel.
    """

    model_config = ConfigDict(extra="forbid")

    base_url: str
    api_key: str | None = Field(default=None, repr=False)
    api_key_env: str | None = None
    timeout: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=3, ge=0, le=20)
    # Seconds before the first retry, doubled for each next one (with jitter) up to the max.
    retry_backoff: float = Field(default=0.5, ge=0)
    retry_backoff_max: float = Field(default=8.0, ge=0)
    allow_unlisted_models: bool = Field(
        default=False,
        description="Forward a model id that model_routing does not list to the upstream, with "
        "the channel's key; by default such a call is answered 404 model_not_found, listing "
        "the known ids, and nothing is sent.",
    )

    @model_validator(mode="before")
    @classmethod
    def _key_from_env(cls, data: Any) -> Any:
        """``api_key: ${VAR}`` given as a plain mapping (not through a YAML file), or only
        ``api_key_env``: read the key from the environment and remember the variable's name."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        key = data.get("api_key")
        if isinstance(key, str) and ENV_PATTERN.search(key):
            used: dict[str, list[str]] = {}
            data["api_key"] = substitute_env(key, "api_key", used, optional=("api_key",))
            data.setdefault("api_key_env", key_variable(used["api_key"]))
        elif key is None and isinstance(data.get("api_key_env"), str):
            data["api_key"] = os.environ.get(data["api_key_env"])
        return data

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parsed = urlsplit(value.strip())
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(
                f"{value!r} is not an http(s) URL; write the upstream's OpenAI-compatible base, "
                "e.g. https://taotoken.net/api"
            )
        return value.strip().rstrip("/")

    @property
    def unset_key_env(self) -> str | None:
        """The variable ``api_key`` reads, when it was not set as the config loaded."""
        return self.api_key_env if self.api_key is None and self.api_key_env else None

    @property
    def host(self) -> str:
        """The upstream's host (and port when one is written), as ``gateway.log`` shows it."""
        parsed = urlsplit(self.base_url)
        return parsed.netloc.rpartition("@")[2]


class ModelRoute(BaseModel):
    """Defaults for one model id; ``max_tokens`` also caps what a client asks for."""

    model_config = ConfigDict(extra="forbid")

    model_id: str = Field(min_length=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, gt=0)
    override_client_sampling: bool = Field(
        default=False,
        description="The route's temperature and top_p replace a client's, and a client's top_k "
        "and min_p are dropped (a training run's policy: every episode sampled alike).",
    )
    tool_parser: str | None = Field(
        default=None,
        description="The policy's tool-call parser (a registered tool parser; default hermes); "
        "only the policy route's is used.",
    )

    @field_validator("tool_parser")
    @classmethod
    def _registered_parser(cls, value: str | None) -> str | None:
        from areal.core.plugins import registry

        if value is not None:
            registry("tool_parsers").get(value, key="tool_parser")  # names the known ones
        return value


class ModelRouting(BaseModel):
    """Named routes: the policy, the seed's reward and judge models, and any more roles
    (``critic_model: {...}``), each a :class:`ModelRoute`."""

    model_config = ConfigDict(extra="allow")

    policy_model: ModelRoute = ModelRoute(model_id="policy")
    reward_model: ModelRoute | None = None
    judge_model: ModelRoute | None = None

    @model_validator(mode="after")
    def _extra_roles_are_routes(self) -> ModelRouting:
        for name, value in (self.model_extra or {}).items():
            if isinstance(value, ModelRoute):
                continue
            if not isinstance(value, dict):
                raise ValueError(
                    f"{key_path(('model_routing', name))}: each entry of model_routing is a route "
                    "{model_id, temperature, top_p, max_tokens}"
                )
            try:
                route = ModelRoute.model_validate(value)
            except ValidationError as err:
                raise ValueError(
                    "; ".join(
                        f"{key_path(('model_routing', name, *e['loc']))}: "
                        + ("unknown key" if e["type"] == "extra_forbidden" else e["msg"])
                        for e in err.errors()
                    )
                ) from None
            assert self.model_extra is not None
            self.model_extra[name] = route
        return self

    def roles(self) -> dict[str, ModelRoute]:
        """Every configured route by its role (``policy_model`` first)."""
        found: dict[str, ModelRoute] = {}
        for name in ("policy_model", "reward_model", "judge_model", *(self.model_extra or {})):
            value = getattr(self, name, None)
            if isinstance(value, ModelRoute):
                found[name] = value
        return found

    def routes(self) -> dict[str, ModelRoute]:
        """Every configured route by model id."""
        found: dict[str, ModelRoute] = {}
        for route in self.roles().values():
            found.setdefault(route.model_id, route)
        return found


class RouterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    api_gateway: ApiGatewayConfig | None = None
    model_routing: ModelRouting = ModelRouting()

    @property
    def policy(self) -> ModelRoute:
        return self.model_routing.policy_model

    def warnings(self) -> list[str]:
        """What loads but cannot work as the environment is: the channel's key variable unset."""
        name = self.api_gateway.unset_key_env if self.api_gateway else None
        if name is None:
            return []
        return [f"{KEY_PATH}: environment variable {name} is not set (export {name}=...)"]

    @classmethod
    def load(cls, path: str | Path) -> RouterConfig:
        """Read a router file; an unset key variable is left to :meth:`warnings`."""
        used: dict[str, list[str]] = {}
        data = load_yaml(path, used, optional=(KEY_PATH,))
        gateway = data.get("api_gateway")
        env_names = used.get(KEY_PATH)
        if isinstance(gateway, dict) and env_names:
            gateway.setdefault("api_key_env", key_variable(env_names))
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise ConfigError(f"{path}: {describe_errors(err)}") from None


def key_variable(names: list[str]) -> str:
    """Of the variables ``api_key`` reads, the one to name: the first unset, else the first."""
    return next((n for n in names if n not in os.environ), names[0])
