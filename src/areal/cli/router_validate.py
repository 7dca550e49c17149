"""``areal config validate`` on a router file (``api_gateway`` + ``model_routing``).

The file is checked by the gateway's own loader, so what validates here is what the gateway
starts with; an unset key variable is a warning, as it is for the gateway (the policy needs no
key). torch is never imported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from areal.core.config import ConfigError
from areal.gateway.router_config import RouterConfig

ROUTER_KEYS = frozenset({"api_gateway", "model_routing"})


def is_router_file(path: Path) -> bool:
    """A YAML mapping whose top-level keys are only the router's (run configs have others)."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False  # the run config loader says what is wrong with it
    return isinstance(data, dict) and bool(data) and set(data) <= ROUTER_KEYS


@dataclass
class RouterReport:
    """What ``validate`` found in a router file."""

    config: str
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    upstream: str | None = None
    policy: str | None = None
    routes: dict[str, str] = field(default_factory=dict)  # role -> model id
    allow_unlisted_models: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "kind": "router",
            "valid": not self.errors,
            "errors": self.errors,
            "warnings": self.warnings,
            "upstream": self.upstream,
            "policy": self.policy,
            "routes": self.routes,
            "allow_unlisted_models": self.allow_unlisted_models,
        }

    def summary(self) -> list[str]:
        """The lines after ``FILE: valid router config``: where each model id goes."""
        upstream = self.upstream or "none (no api_gateway: only the policy is served)"
        lines = [f"upstream: {upstream}"]
        lines.append(f"policy: {self.policy} (policy_model, served by areal's engines)")
        others = [
            f"{model} ({role})" for role, model in self.routes.items() if model != self.policy
        ]
        if others:
            lines.append(f"routed to the upstream: {', '.join(others)}")
        if self.upstream is None:
            return lines
        if self.allow_unlisted_models:
            lines.append(
                "any other model id: forwarded to the upstream with the channel's key "
                "(api_gateway.allow_unlisted_models: true)"
            )
        else:
            lines.append("any other model id: refused, 404 model_not_found (nothing is sent)")
        return lines


def check_router(path: Path) -> RouterReport:
    """Load ``path`` with :meth:`RouterConfig.load`; errors and warnings as one line each."""
    report = RouterReport(str(path))
    try:
        router = RouterConfig.load(path)
    except ConfigError as err:
        report.errors.append(str(err))
        return report
    report.warnings = router.warnings()
    report.upstream = router.api_gateway.base_url if router.api_gateway else None
    report.policy = router.policy.model_id
    report.routes = {role: r.model_id for role, r in router.model_routing.roles().items()}
    report.allow_unlisted_models = bool(
        router.api_gateway and router.api_gateway.allow_unlisted_models
    )
    return report
