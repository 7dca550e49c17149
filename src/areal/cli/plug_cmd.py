"""``areal plug``: which plugins are loaded, and what each one adds."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from areal.cli.errors import CLIError
from areal.core.plugins import (
    PluginInfo,
    get_plugin_manager,
    list_plugins,
    normalize_name,
    plugin_contributions,
)
from areal.core.registry import call_impl

app = typer.Typer(
    help="Inspect plugins: the built-ins and those installed under the [bold]areal[/bold] "
    "entry-point group.\n\nExample: [bold]areal plug list --json[/bold]",
    no_args_is_help=True,
    rich_markup_mode="rich",
)


@app.command("list")
def list_command(
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """List loaded plugins with their version and the hooks they implement.

    Example: [bold]AREAL_BLOCK_PLUGINS=areal-foo areal plug list[/bold]
    """
    plugins = list_plugins()
    if as_json:
        typer.echo(json.dumps([asdict(p) for p in plugins], indent=2))
        return
    table = Table()
    for column in ("name", "version", "builtin", "hooks"):
        table.add_column(column, overflow="fold")
    for p in plugins:
        table.add_row(p.name, p.version or "?", "yes" if p.builtin else "no", "\n".join(p.hooks))
    Console().print(table)


@app.command("info")
def info_command(
    name: str = typer.Argument(..., help="Plugin name (as in `plug list`) or its distribution."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Show one plugin's hooks and what it registers (model families, backends, commands...).

    Example: [bold]areal plug info areal.plugins.models.register[/bold]
    """
    plugin = find_plugin(name)
    details: dict[str, Any] = asdict(plugin)
    details["registers"] = plugin_contributions(plugin.name)
    details["commands"] = _commands_of(plugin.name)
    if as_json:
        typer.echo(json.dumps(details, indent=2))
        return
    table = Table("field", "value", show_header=False)
    for key, value in details.items():
        if isinstance(value, dict):
            for kind, names in value.items():
                table.add_row(f"{key}: {kind}", ", ".join(names))
        elif isinstance(value, (list, tuple)):
            table.add_row(key, "\n".join(value) or "-")
        else:
            table.add_row(key, "-" if value is None else str(value))
    Console().print(table)


def find_plugin(name: str) -> PluginInfo:
    """The loaded plugin called ``name``, or a third-party one whose distribution is ``name``."""
    plugins = list_plugins()
    wanted = normalize_name(name)
    matches = [p for p in plugins if normalize_name(p.name) == wanted]
    if not matches:
        matches = [
            p
            for p in plugins
            if not p.builtin and p.distribution and normalize_name(p.distribution) == wanted
        ]
    if len(matches) == 1:
        return matches[0]
    if matches:
        names = ", ".join(p.name for p in matches)
        raise CLIError(f"{name!r} matches several plugins: {names}; give the plugin name")
    loaded = ", ".join(p.name for p in plugins) or "none"
    raise CLIError(f"no plugin named {name!r}; loaded: {loaded}")


def _commands_of(plugin_name: str) -> list[str]:
    """Run only this plugin's ``areal_register_commands`` on a scratch app to see what it adds."""
    from areal.cli.main import added_command_names

    scratch = typer.Typer()
    for impl in get_plugin_manager().hook.areal_register_commands.get_hookimpls():
        if impl.plugin_name == plugin_name and not (impl.hookwrapper or impl.wrapper):
            call_impl(impl, cli=scratch)
    return added_command_names(scratch)
