"""``areal config``: check a run config before a run spends time starting processes.

``validate`` separates what is wrong with the file (errors, exit 1) from what this machine cannot
provide and settings that do not fit the model (warnings, exit 0 unless ``--strict``): a config
written for an 8-GPU node is still a correct config on a laptop, and a learning rate of areal's
tiny model is a valid value that wrecks a pretrained checkpoint. It takes router files too (only ``api_gateway`` / ``model_routing``
at the top), checked as the gateway loads them. torch is never imported here.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from areal.cli.errors import CLIError
from areal.cli.router_validate import check_router, is_router_file
from areal.core.config import ConfigError
from areal.core.run_config import RunConfig, RunConfigError, load_run_config
from areal.run.machine import check_machine
from areal.run.model_scale import scale_warnings

app = typer.Typer(
    help="Validate, show and describe run configs.\n\n"
    "Example: [bold]areal config validate configs/quickstart.yaml --set train.max_steps=5[/bold]",
    no_args_is_help=True,
    rich_markup_mode="rich",
)

CONFIG_ARG = typer.Argument(..., help="Run config YAML (${VAR} read from the environment).")
VALIDATE_ARG = typer.Argument(
    ..., help="Run config or router config YAML (${VAR} read from the environment)."
)
SET_OPTION = typer.Option(
    [], "--set", help="Override one key, e.g. --set async.enabled=false (the value is YAML)."
)


@app.command("validate")
def validate_command(
    config: Path = VALIDATE_ARG,
    overrides: list[str] = SET_OPTION,
    strict: bool = typer.Option(
        False,
        "--strict",
        help="Exit 1 also on a warning: this machine cannot run the config, or a setting does "
        "not fit the model (a tiny-model learning rate on a real checkpoint).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Check a run config: keys, types, consistency, names; then warn about this machine and
    about settings that do not fit the model (a tiny-model learning rate on a real checkpoint).

    A router file (api_gateway, model_routing) is checked as the gateway loads it.

    Example: [bold]areal config validate configs/agent_async_train.yaml --strict[/bold]
    """
    if is_router_file(config):
        _validate_router(config, overrides, strict, as_json)
        return
    errors: list[str] = []
    machine: list[str] = []  # what this machine cannot provide
    settings: list[str] = []  # settings that do not fit the model (tiny-model learning rates)
    message = ""  # the errors as one line, with the file name
    try:
        run = load_run_config(config, overrides)
        machine, settings = check_machine(run), scale_warnings(run)
    except RunConfigError as err:
        errors, message = err.errors, str(err)
    except ConfigError as err:
        errors, message = [str(err)], str(err)
    warnings = machine + settings
    failed = bool(errors) or (strict and bool(warnings))
    if as_json:
        report = {"config": str(config), "kind": "run", "valid": not errors, "errors": errors}
        typer.echo(json.dumps({**report, "warnings": warnings}, indent=2, ensure_ascii=False))
        if failed:
            raise typer.Exit(1)
        return
    if errors:
        raise CLIError(message)
    for warning in warnings:
        typer.echo(f"warning: {warning}", err=True)
    typer.echo(f"{config}: valid{_warnings_note(machine, settings)}")
    if failed:
        why = "this machine cannot run it" if not settings else "the warnings above"
        raise CLIError(f"{config}: {why} (--strict)")


def _warnings_note(machine: list[str], settings: list[str]) -> str:
    """`` (1 warning about this machine)``, `` (2 warnings: 1 about this machine, 1 about the
    settings for this model)``; empty without warnings."""
    parts = [
        (len(found), what)
        for found, what in ((machine, "this machine"), (settings, "the settings for this model"))
        if found
    ]
    total = sum(n for n, _ in parts)
    plural = "s" if total != 1 else ""
    if len(parts) == 1:
        return f" ({total} warning{plural} about {parts[0][1]})"
    if parts:
        return f" ({total} warnings: " + ", ".join(f"{n} about {w}" for n, w in parts) + ")"
    return ""


def _validate_router(config: Path, overrides: list[str], strict: bool, as_json: bool) -> None:
    if overrides:
        raise CLIError(
            f"{config} is a router config (api_gateway, model_routing); --set applies to run "
            "configs: edit the file instead"
        )
    report = check_router(config)
    failed = bool(report.errors) or (strict and bool(report.warnings))
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2, ensure_ascii=False))
        if failed:
            raise typer.Exit(1)
        return
    if report.errors:
        raise CLIError("; ".join(report.errors))
    for warning in report.warnings:
        typer.echo(f"warning: {warning}", err=True)
    count = len(report.warnings)
    note = f" ({count} warning{'s' if count != 1 else ''})" if count else ""
    typer.echo(f"{config}: valid router config{note}")
    for line in report.summary():
        typer.echo(line)
    if failed:
        raise CLIError(f"{config}: the warnings above (--strict)")


@app.command("show")
def show_command(config: Path = CONFIG_ARG, overrides: list[str] = SET_OPTION) -> None:
    """Print the resolved config as YAML: defaults filled, ${VAR} and --set applied.

    Example: [bold]areal config show configs/quickstart.yaml --set async.enabled=false[/bold]
    """
    try:
        resolved = load_run_config(config, overrides)
    except ConfigError as err:
        raise CLIError(str(err)) from None
    typer.echo(resolved.to_yaml(), nl=False)


@app.command("schema")
def schema_command() -> None:
    """Print the JSON schema of run configs (for editors and docs).

    Example: [bold]areal config schema > run_config.schema.json[/bold]
    """
    schema = RunConfig.model_json_schema(by_alias=True)
    typer.echo(json.dumps(schema, indent=2, ensure_ascii=False))
