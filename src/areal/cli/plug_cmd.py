"""``areal plug``: install, remove and inspect plugins (what is loaded, and what each one adds).

``install``/``uninstall`` wrap pip of the running interpreter, so a plugin lands where this areal
looks for it, then check what pip did: an installed package that declares no ``areal`` entry point
is a mistake worth one clear line, and ``uninstall`` only ever removes plugins.
"""

from __future__ import annotations

import importlib
import json
import site
import sys
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

import pluggy
import typer
from rich.console import Console
from rich.table import Table

from areal.cli import pip_runner
from areal.cli.errors import CLIError
from areal.core import hookspecs
from areal.core.plugins import (
    DEFAULT_PLUGINS,
    ENTRY_POINT_GROUP,
    PluginError,
    PluginInfo,
    get_plugin_manager,
    list_plugins,
    normalize_name,
    plugin_aliases,
    plugin_contributions,
    registry,
)
from areal.core.registry import RegistryError, call_impl

app = typer.Typer(
    help="Install, remove and inspect plugins: the built-ins and those installed under the "
    "[bold]areal[/bold] entry-point group.\n\nExample: [bold]areal plug install areal-foo[/bold]",
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
    """Show one plugin's hooks and what it registers (model families, backends, commands...),
    and the aliases it gives some of them.

    Example: [bold]areal plug info areal.plugins.models.register[/bold]
    """
    plugin = find_plugin(name)
    details: dict[str, Any] = asdict(plugin)
    details["registers"] = plugin_contributions(plugin.name)
    details["aliases"] = plugin_aliases(plugin.name)
    details["commands"] = _commands_of(plugin.name)
    if as_json:
        typer.echo(json.dumps(details, indent=2))
        return
    table = Table("field", "value", show_header=False)
    for key, value in details.items():
        if isinstance(value, dict):
            for kind, names in value.items():
                shown = (f"{a} = {n}" for a, n in names.items()) if key == "aliases" else names
                table.add_row(f"{key}: {kind}", ", ".join(shown))
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


# --- install / uninstall ----------------------------------------------------------------------

JSON_OPTION = typer.Option(False, "--json", help="Print JSON for scripts (pip's output is hidden).")
QUIET_OPTION = typer.Option(False, "-q", "--quiet", help="Hide pip's output.")


@app.command("install")
def install_command(
    spec: str = typer.Argument(
        ..., help="A package name (areal-foo, areal-foo>=1.2), a plugin project's folder or a URL."
    ),
    editable: bool = typer.Option(
        False, "-e", "--editable", help="Install a local project in editable mode (pip -e)."
    ),
    upgrade: bool = typer.Option(False, "-U", "--upgrade", help="Upgrade if already installed."),
    no_deps: bool = typer.Option(False, "--no-deps", help="Do not install dependencies."),
    no_build_isolation: bool = typer.Option(
        False, "--no-build-isolation", help="Build with this environment's setuptools (offline)."
    ),
    pip_args: list[str] = typer.Option(
        [], "--pip-arg", help="One more pip argument, e.g. --pip-arg=--index-url=URL."
    ),
    as_json: bool = JSON_OPTION,
    quiet: bool = QUIET_OPTION,
) -> None:
    """Install a plugin with this interpreter's pip and show the hooks it implements.

    Example: [bold]areal plug install -e examples/areal-example-reward[/bold]
    """
    target, requested_name = pip_runner.pip_target(spec)
    echo = None if as_json or quiet else sys.stderr
    installed = pip_runner.install(
        target,
        editable=editable,
        upgrade=upgrade,
        no_deps=no_deps,
        no_build_isolation=no_build_isolation,
        pip_args=pip_args,
        echo=echo,
    )
    dist = _installed_distribution(installed, requested_name, spec)
    forget_modules([ep for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP])
    refresh_plugins(dist)
    plugins = _entry_point_plugins(dist)
    result = {"distribution": dist.name, "version": dist.version, "editable": editable}
    result["plugins"] = plugins
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    typer.echo(f"installed {dist.name} {dist.version}")
    for plugin in plugins:
        hooks = ", ".join(plugin["hooks"]) or "no hooks"
        typer.echo(f"plugin {plugin['name']} ({plugin['module']}): {hooks}")
        for kind, names in plugin["registers"].items():
            typer.echo(f"  {kind}: {', '.join(names)}")
        if plugin["commands"]:
            typer.echo(f"  commands: {', '.join(plugin['commands'])}")


@app.command("uninstall")
def uninstall_command(
    name: str = typer.Argument(..., help="Plugin name (as in `plug list`) or its distribution."),
    as_json: bool = JSON_OPTION,
    quiet: bool = QUIET_OPTION,
) -> None:
    """Uninstall a plugin's distribution with pip; refuses anything that is not an areal plugin.

    Example: [bold]areal plug uninstall areal-example-reward[/bold]
    """
    dist = installed_plugin_distribution(name)
    eps = [ep for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP]
    plugins = sorted(ep.name for ep in eps)
    # Read now: the metadata files are gone once pip is done.
    result: dict[str, Any] = {"distribution": dist.name, "version": dist.version}
    result["plugins"] = plugins
    dist_name = result["distribution"]
    copies = _copies(dist_name)
    pip_runner.uninstall(dist_name, echo=None if as_json or quiet else sys.stderr)
    forget_modules(eps)
    refresh_plugins(None)
    if _copies(dist_name) >= copies:
        # pip says "Not uninstalling ... outside environment" and exits 0.
        raise CLIError(
            f"pip left {dist_name} in place: it is installed outside this environment "
            f"({sys.prefix}); uninstall it with the pip of the environment that holds it"
        )
    if as_json:
        typer.echo(json.dumps({"uninstalled": result}, indent=2))
    else:
        name_version = f"{result['distribution']} {result['version']}"
        typer.echo(f"uninstalled {name_version} (plugin {', '.join(plugins)})")


def installed_plugin_distribution(name: str) -> metadata.Distribution:
    """The installed distribution that provides plugin ``name`` (entry-point or distribution
    name); a clear refusal for areal itself, a built-in, or a package that is no plugin."""
    wanted = normalize_name(name)
    if wanted == "areal":
        raise CLIError(
            "refusing to uninstall areal itself: `areal plug uninstall` removes plugins only"
        )
    if wanted in {normalize_name(m) for m in DEFAULT_PLUGINS}:
        raise CLIError(
            f"{name} is built into areal and cannot be uninstalled; "
            f"to switch it off set AREAL_BLOCK_PLUGINS={name}"
        )
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.dist is not None and wanted in {
            normalize_name(ep.name),
            normalize_name(ep.dist.name),
        }:
            return ep.dist
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
        names = sorted({ep.dist.name for ep in eps if ep.dist is not None})
        raise CLIError(
            f"no installed plugin named {name!r}; installed plugins: {', '.join(names) or 'none'}"
        ) from None
    raise CLIError(
        f"{dist.name} is not an areal plugin (it declares no {ENTRY_POINT_GROUP!r} entry point), "
        f"so `areal plug uninstall` leaves it alone; use `pip uninstall {dist.name}` if you mean it"
    )


def refresh_plugins(dist: metadata.Distribution | None) -> None:
    """Make this process see what pip just changed: the next ``get_plugin_manager()`` or
    ``get_app()`` rebuilds from the entry points, and an editable install's ``.pth`` is applied
    (Python reads ``.pth`` files only at start-up)."""
    importlib.invalidate_caches()
    for file in (dist.files or []) if dist is not None else []:
        if file.suffix == ".pth" and len(file.parts) == 1:
            path = Path(str(dist.locate_file(file)))  # type: ignore[union-attr]
            site.addpackage(str(path.parent), path.name, None)
    get_plugin_manager.cache_clear()
    from areal.cli.main import get_app

    get_app.cache_clear()


def forget_modules(eps: list[metadata.EntryPoint]) -> None:
    """Drop the plugin's packages from ``sys.modules``, so this process imports the version now
    installed (or fails to, once uninstalled) instead of reusing what it imported before."""
    tops = {ep.module.partition(".")[0] for ep in eps} - {"areal"}
    for name in [m for m in sys.modules if m.partition(".")[0] in tops]:
        del sys.modules[name]


def _copies(dist_name: str) -> int:
    """How many metadata folders of ``dist_name`` are on ``sys.path``: an editable install's
    project folder can hold a stale ``*.egg-info`` next to the real one in site-packages."""
    return sum(1 for _ in metadata.distributions(name=dist_name))


def _installed_distribution(
    installed: list[pip_runner.Installed], requested_name: str | None, spec: str
) -> metadata.Distribution:
    """The distribution pip installed for ``spec``: from pip's report, else the requested name."""
    names = [i.name for i in installed if i.requested] or (
        [requested_name] if requested_name else []
    )
    if not names:
        raise CLIError(f"pip installed nothing for {spec}; add -U to reinstall or upgrade it")
    importlib.invalidate_caches()
    try:
        return metadata.distribution(names[0])
    except metadata.PackageNotFoundError:
        raise CLIError(
            f"pip reported {names[0]} installed, but this interpreter ({sys.executable}) "
            "cannot find it; is pip installing into another environment (PIP_TARGET, --user)?"
        ) from None


def _entry_point_plugins(dist: metadata.Distribution) -> list[dict[str, Any]]:
    """Each ``areal`` entry point of ``dist``: the hooks it implements and what it registers.

    Loading it here, in a scratch plugin manager, catches a broken plugin now, not at the next run;
    then the process-wide manager is rebuilt so a clash with another plugin shows too.
    """
    eps = [ep for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP]
    if not eps:
        module = dist.name.replace("-", "_").lower()
        short = normalize_name(dist.name).removeprefix("areal-")
        raise CLIError(
            f"{dist.name} is installed but declares no {ENTRY_POINT_GROUP!r} entry point, so areal "
            f"will not load it; add to its pyproject.toml: "
            f'[project.entry-points.{ENTRY_POINT_GROUP}] {short} = "{module}" '
            f"(then reinstall), or remove it with `pip uninstall {dist.name}`"
        )
    plugins = []
    for ep in eps:
        hooks = _hooks_of(ep, dist.name)
        plugins.append({"name": ep.name, "module": ep.value, "hooks": hooks, **_loaded_view(ep)})
    return plugins


def _hooks_of(ep: metadata.EntryPoint, dist_name: str) -> list[str]:
    """Load one entry point alone and list the areal hooks it implements (unknown hooks fail)."""
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    try:
        plugin = ep.load()
        pm.register(plugin, name=ep.name)
        pm.check_pending()
    except Exception as exc:
        raise CLIError(
            f"{dist_name} is installed but its plugin {ep.name!r} fails to load: {exc}; "
            f"fix it or run `areal plug uninstall {dist_name}`"
        ) from None
    return sorted(caller.name for caller in pm.get_hookcallers(plugin) or [])


def _loaded_view(ep: metadata.EntryPoint) -> dict[str, Any]:
    """What the process-wide manager makes of the new plugin: loaded (or blocked by
    ``AREAL_LOAD_PLUGINS``/``AREAL_BLOCK_PLUGINS``), what it registers and which commands it adds;
    a clash with an installed plugin is an error now rather than at the next run."""
    try:
        pm = get_plugin_manager()
        if pm.get_plugin(ep.name) is None:
            return {"loaded": False, "registers": {}, "commands": []}
        registers = plugin_contributions(ep.name, pm)
        for kind in registers:
            registry(kind, pm)
        from areal.cli.main import get_app

        get_app()
        return {"loaded": True, "registers": registers, "commands": _commands_of(ep.name)}
    except (PluginError, RegistryError) as exc:
        raise CLIError(
            f"{ep.dist.name if ep.dist else ep.name} is installed but areal cannot load it "
            f"with the other plugins: {exc}; remove one with `areal plug uninstall NAME`"
        ) from None
