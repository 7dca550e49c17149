"""``areal check-channel``: one chat call through the router config's unified API channel (the
seed's ``check_channel.py``), before a run depends on it for rewards or judges.

Exit codes are for scripts: 0 the channel answered, 1 the channel is broken (the message says
whether the base URL, the key or the model id is wrong), 2 the command could not try (no such
file, no ``api_gateway`` section, no model to try).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
import yaml
from rich.console import Console
from rich.markup import escape

from areal.core.config import ConfigError, substitute_env
from areal.gateway.router_config import RouterConfig

if TYPE_CHECKING:  # the probe pulls in aiohttp and the gateway: loaded only when the check runs
    from areal.tools.channel_probe import ChannelProbe, ProbeResult

USAGE_EXIT = 2
BROKEN_EXIT = 1
# Roles tried when --model is not given: the ones the channel serves in a run.
_ROLES = ("reward_model", "judge_model")


class _Usage(Exception):
    """The check could not be tried; exit 2."""


def check_channel_command(
    config: Path = typer.Option(
        ..., "--config", help="Router YAML with api_gateway (base_url, api_key: ${VAR})."
    ),
    model: str | None = typer.Option(
        None, "--model", help="Model id to try (default: the reward, then the judge model)."
    ),
    prompt: str = typer.Option(
        "Reply with one short sentence: is this channel working?", "--prompt", help="What to ask."
    ),
    max_tokens: int = typer.Option(64, "--max-tokens", min=1, help="Length of the reply at most."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Send one chat call through the unified API channel and print the reply.

    Example: [bold]areal check-channel --config configs/taotoken_router.yaml --model your-judge-model-id[/bold]

    On failure, says which is wrong: the base URL, the key (by its environment variable, never
    shown) or the model id. Exit 0 ok, 1 channel broken, 2 usage.
    """
    try:
        result = _missing_key(config)
        if result is None:
            result = asyncio.run(_probe(config, model, prompt, max_tokens).run())
    except _Usage as err:
        _emit_usage(str(err), as_json)
        raise typer.Exit(USAGE_EXIT) from None
    _emit(result, as_json)
    if not result.ok:
        raise typer.Exit(BROKEN_EXIT)


def _probe(config: Path, model: str | None, prompt: str, max_tokens: int) -> ChannelProbe:
    from areal.tools.channel_probe import ChannelProbe

    try:
        router = RouterConfig.load(config)
    except ConfigError as err:
        raise _Usage(str(err)) from None
    if router.api_gateway is None:
        raise _Usage(
            f"{config} has no api_gateway section, so there is no channel to check; add "
            "api_gateway: {base_url, api_key: ${VAR}} (see configs/taotoken_router.yaml)"
        )
    routes = router.model_routing.routes()
    if model is None:
        model = _default_model(router)
    if model is None:
        raise _Usage(
            f"{config} routes only the policy (served by areal, not by the channel); name the "
            "model to try with --model ID"
        )
    return ChannelProbe(
        router.api_gateway,
        model,
        source=str(config),
        route=routes.get(model),
        prompt=prompt,
        max_tokens=max_tokens,
    )


def _default_model(router: RouterConfig) -> str | None:
    """The reward model, else the judge, else any other non-policy route."""
    routing = router.model_routing
    extra = list(routing.model_extra or {})
    for role in (*_ROLES, *extra):
        route = getattr(routing, role, None)
        model_id = getattr(route, "model_id", None)
        if isinstance(model_id, str) and model_id != router.policy.model_id:
            return model_id
    return None


def _missing_key(config: Path) -> ProbeResult | None:
    """``api_key: ${VAR}`` with VAR unset: the key is the culprit, named by its variable.

    Read before ``${ENV}`` substitution, which would only say "not set" for the whole file.
    """
    from areal.tools.channel_probe import ProbeResult

    try:
        data = yaml.safe_load(config.read_text())
    except (OSError, yaml.YAMLError):
        return None  # RouterConfig.load says what is wrong with the file
    gateway = data.get("api_gateway") if isinstance(data, dict) else None
    if not isinstance(gateway, dict):
        return None
    key, name = gateway.get("api_key"), gateway.get("api_key_env")
    if isinstance(key, str):
        used: dict[str, list[str]] = {}
        try:
            substitute_env(key, "api_key", used)
            return None
        except ConfigError:
            name = used["api_key"][-1]  # the variable that stopped the substitution
    elif key is not None or not isinstance(name, str) or name in os.environ:
        return None
    base_url = gateway.get("base_url")
    return ProbeResult(
        ok=False,
        base_url=base_url if isinstance(base_url, str) else "",
        model="",
        message=f"the API key is missing: api_gateway.api_key in {config} reads the "
        f"environment variable {name}, which is not set",
        culprit="key",
        fix=f"export {name}=<your key> (or put it in the environment the run starts from)",
        key_env=name,
    )


def _emit(result: ProbeResult, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=2, ensure_ascii=False))
        return
    if result.ok:
        typer.echo(f"ok: {result.message}")
        typer.echo(result.reply or "(an empty reply: raise --max-tokens)")
        return
    _error(f"{result.message}; {result.fix}" if result.fix else result.message)


def _emit_usage(message: str, as_json: bool) -> None:
    if as_json:
        report: dict[str, Any] = {"ok": False, "culprit": "config", "message": message}
        typer.echo(json.dumps(report, indent=2, ensure_ascii=False))
        return
    _error(message)


def _error(message: str) -> None:
    Console(stderr=True, highlight=False).print(
        f"[bold red]error:[/bold red] {escape(message)}", soft_wrap=True
    )
