"""The ``areal`` command: a typer app whose command groups all come from plugins.

Built-in groups (``plug``, ``model``, ``serve``) arrive through ``areal_register_commands`` exactly
like a third-party plugin's, so this module only builds the root, runs it, and turns exceptions
into one readable line. Nothing here imports torch: heavy imports live inside the commands.
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import traceback
from functools import cache
from typing import Any

import pluggy
import typer
from rich.console import Console
from rich.markup import escape

from areal import __version__
from areal.cli.errors import CLIError
from areal.core.plugins import PluginError, get_plugin_manager
from areal.core.registry import RegistryError, call_impl

HELP = """Fully asynchronous RL for the LLM agents you already have.

Example: [bold]areal model init-tiny ./tiny && areal serve inference --model ./tiny[/bold]
"""

# Errors a person can fix from the message alone: no type name, no hint about --debug.
USER_ERRORS: tuple[type[BaseException], ...] = (
    CLIError,
    RegistryError,
    PluginError,
    FileNotFoundError,
    FileExistsError,
    NotADirectoryError,
    IsADirectoryError,
    PermissionError,
)

_debug_flag = False


def make_app(pm: pluggy.PluginManager | None = None) -> typer.Typer:
    """A fresh root app with every plugin's commands (tests pass their own plugin manager)."""
    root = typer.Typer(
        name="areal",
        help=HELP,
        no_args_is_help=True,
        rich_markup_mode="rich",
        pretty_exceptions_enable=False,
    )
    root.callback()(_root_options)
    root.command("version")(version)
    _add_plugin_commands(root, pm or get_plugin_manager())
    return root


@cache
def get_app() -> typer.Typer:
    """The process-wide app, built on first use so plugin errors surface inside :func:`main`."""
    return make_app()


def __getattr__(name: str) -> Any:
    # ``from areal.cli.main import app`` builds the app lazily: importing this module loads no
    # plugin, so a broken plugin is reported by main() as one line instead of an import traceback.
    if name == "app":
        return get_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _root_options(
    debug: bool = typer.Option(
        False, "--debug", envvar="AREAL_DEBUG", help="Show full tracebacks on errors."
    ),
) -> None:
    global _debug_flag
    _debug_flag = _debug_flag or debug


def version(
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Show the areal and Python versions.

    Example: [bold]areal version --json[/bold]
    """
    info = {"areal": __version__, "python": platform.python_version()}
    if as_json:
        typer.echo(json.dumps(info))
    else:
        typer.echo(f"areal {info['areal']} (python {info['python']})")


def _add_plugin_commands(root: typer.Typer, pm: pluggy.PluginManager) -> None:
    """Let each plugin add its commands, one at a time, so a name clash can name both plugins."""
    owners = {"version": __name__}
    for impl in pm.hook.areal_register_commands.get_hookimpls():
        if impl.hookwrapper or impl.wrapper:
            continue
        seen = (len(root.registered_commands), len(root.registered_groups))
        call_impl(impl, cli=root)
        for name in added_command_names(root, *seen):
            if name in owners:
                raise PluginError(
                    f"command {name!r} is added twice: by {owners[name]} and by {impl.plugin_name}"
                )
            owners[name] = impl.plugin_name


def added_command_names(root: typer.Typer, n_commands: int = 0, n_groups: int = 0) -> list[str]:
    """Names of the commands and groups added to ``root`` after the first ``n_*`` of each."""
    names = []
    for command in root.registered_commands[n_commands:]:
        name = command.name or (command.callback.__name__ if command.callback else None)
        if name:
            names.append(name.lower().replace("_", "-"))
    for group in root.registered_groups[n_groups:]:
        name = group.name or (group.typer_instance.info.name if group.typer_instance else None)
        if isinstance(name, str):
            names.append(name)
    return names


def _debug_requested(args: list[str]) -> bool:
    env = os.environ.get("AREAL_DEBUG", "").strip().lower()
    return _debug_flag or "--debug" in args or env in {"1", "true", "yes", "on"}


def report_error(exc: BaseException, *, debug: bool) -> None:
    """Print ``error: ...`` as one red line on stderr; the traceback first, only when debugging."""
    if debug:
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    message = one_line(str(exc)) or type(exc).__name__
    if not isinstance(exc, USER_ERRORS):
        message = f"{type(exc).__name__}: {message}"
        if not debug:
            message += " (run with --debug for the traceback)"
    Console(stderr=True, highlight=False).print(
        f"[bold red]error:[/bold red] {escape(message)}", soft_wrap=True
    )


def one_line(text: str) -> str:
    """Fold a multi-line message (a validation report, say) into one line, parts split by "; "."""
    parts = [line.strip() for line in text.splitlines() if line.strip()]
    return re.sub(r":; ", ": ", "; ".join(parts))


def main(argv: list[str] | None = None, *, app: typer.Typer | None = None) -> int:
    """Run ``areal`` and return its exit code: 0 ok, 1 error, 2 usage error (as click does).

    ``app`` replaces the process-wide app, so a test can run one built from its own plugins.
    """
    global _debug_flag
    _debug_flag = False
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        command = typer.main.get_command(app or get_app())
        command.main(args=args, prog_name="areal", standalone_mode=True)
    except SystemExit as exc:
        return _exit_code(exc.code)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        report_error(exc, debug=_debug_requested(args))
        return 1
    return 0


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
