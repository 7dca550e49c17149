"""The plugin manager: built-ins plus third-party plugins from the ``areal`` entry-point group.

Built-ins go through exactly the same hooks as third-party plugins. Environment variables:

- ``AREAL_LOAD_PLUGINS``: comma-separated distribution or entry-point names; when set, only these
  third-party plugins load (an empty value loads none).
- ``AREAL_BLOCK_PLUGINS``: comma-separated names (built-in module or third-party) never to load.
- ``AREAL_TRACE_PLUGINS=1``: write every hook call to stderr, with the plugins that answered, the
  arguments and the results (:mod:`areal.core.plugin_trace`), as datasette's
  ``DATASETTE_TRACE_PLUGINS`` does.

Names compare the way package names do: case-insensitive, with ``-``, ``_`` and ``.`` alike, so
``areal-demo`` and ``areal_demo`` name the same plugin.
"""

from __future__ import annotations

import importlib
import os
import re
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from typing import Any

import pluggy

from areal.core import hookspecs
from areal.core.plugin_trace import trace_hook_calls, trace_requested
from areal.core.registry import Registry, RegistryError, collect

ENTRY_POINT_GROUP = "areal"

DEFAULT_PLUGINS: tuple[str, ...] = (
    "areal.plugins.models.register",
    "areal.plugins.inference.register",
    "areal.plugins.launchers.register",
    "areal.plugins.tool_parsers.register",
    "areal.plugins.queues.register",
    "areal.plugins.rewards.register",
    "areal.plugins.losses.register",
    "areal.plugins.trainer.register",
    "areal.plugins.metrics.register",
    "areal.plugins.tasks.register",
    "areal.adapters.register",
    "areal.cli.monitor.register",
    "areal.cli.builtin_commands",
)

REGISTRY_HOOKS: dict[str, str] = {
    "model_families": "model family",
    "inference_backends": "inference backend",
    "launchers": "launcher",
    "tool_parsers": "tool parser",
    "engines": "training engine",
    "losses": "loss",
    "rewards": "reward",
    "queues": "queue",
    "metric_sinks": "metric sink",
    "adapters": "adapter",
    "task_sets": "task set",
    "monitor_panels": "monitor panel",
}


class PluginError(RuntimeError):
    """A third-party plugin that cannot load: import failure, unknown hook, name clash."""


@dataclass(frozen=True)
class PluginInfo:
    """What ``areal plug list`` shows for one plugin."""

    name: str
    version: str | None
    hooks: tuple[str, ...]
    builtin: bool
    distribution: str | None = None


def normalize_name(name: str) -> str:
    """``Areal_Demo.Plugin`` -> ``areal-demo-plugin``: how package names compare."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _names_from_env(var: str) -> set[str] | None:
    raw = os.environ.get(var)
    if raw is None:
        return None
    return {normalize_name(n.strip()) for n in raw.split(",") if n.strip()}


def make_plugin_manager(*, load_entry_points: bool = True) -> pluggy.PluginManager:
    """Build a fresh plugin manager (tests get their own; the CLI uses :func:`get_plugin_manager`)."""
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    blocked = _names_from_env("AREAL_BLOCK_PLUGINS") or set()
    for module_name in DEFAULT_PLUGINS:
        if normalize_name(module_name) in blocked:
            continue
        pm.register(importlib.import_module(module_name), name=module_name)
    if load_entry_points:
        _load_entry_points(pm, blocked)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        # A misspelt hook name would otherwise be silently never called.
        raise PluginError(f"plugin {pm.get_name(exc.plugin)}: {exc}") from exc
    if trace_requested():
        trace_hook_calls(pm)
    return pm


def _load_entry_points(pm: pluggy.PluginManager, blocked: set[str]) -> None:
    allowed = _names_from_env("AREAL_LOAD_PLUGINS")
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist_name = ep.dist.name if ep.dist is not None else ep.name
        names = {normalize_name(ep.name), normalize_name(dist_name)}
        if names & blocked:
            continue
        if allowed is not None and not names & allowed:
            continue
        if pm.get_plugin(ep.name) is not None:
            other = _DIST_OF.get(ep.name, (ep.name, None))[0]
            if normalize_name(other) == normalize_name(dist_name):
                continue  # the same distribution seen twice on sys.path
            raise PluginError(
                f"plugin name {ep.name!r} is used by two distributions: {other} and {dist_name}"
            )
        try:
            plugin = ep.load()
            pm.register(plugin, name=ep.name)
        except Exception as exc:
            raise PluginError(
                f"plugin {ep.name!r} (from {dist_name}) failed to load: {exc}"
            ) from exc
        if ep.dist is not None:
            _DIST_OF[ep.name] = (ep.dist.name, ep.dist.version)


# entry-point name -> (distribution, version), for ``areal plug list``
_DIST_OF: dict[str, tuple[str, str]] = {}


@cache
def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, built on first use."""
    return make_plugin_manager()


def registry(kind: str, pm: pluggy.PluginManager | None = None) -> Registry[Any]:
    """Gather one registry (``kind`` is a key of :data:`REGISTRY_HOOKS`) from every plugin."""
    pm = pm or get_plugin_manager()
    return collect(_registry_hook(kind, pm), REGISTRY_HOOKS[kind], _namer(pm))


def plugin_contributions(name: str, pm: pluggy.PluginManager | None = None) -> dict[str, list[str]]:
    """What one plugin registers, by registry kind (``{"model_families": ["llama", ...]}``).

    Only that plugin's hooks run, so a clash between two other plugins does not hide its entries.
    """
    return {kind: entries.implementations() for kind, entries in _own_entries(name, pm).items()}


def plugin_aliases(name: str, pm: pluggy.PluginManager | None = None) -> dict[str, dict[str, str]]:
    """The aliases one plugin registers, by registry kind (``{"engines": {"archon": "fsdp"}}``);
    :func:`plugin_contributions` leaves them out, so an alias is not shown as another thing."""
    found = {kind: entries.aliases() for kind, entries in _own_entries(name, pm).items()}
    return {kind: aliases for kind, aliases in found.items() if aliases}


def _own_entries(name: str, pm: pluggy.PluginManager | None) -> dict[str, Registry[Any]]:
    """What only this plugin's register hooks give, by kind (kinds it gives nothing left out)."""
    pm = pm or get_plugin_manager()
    if pm.get_plugin(name) is None:
        raise RegistryError(f"no plugin named {name!r}")
    found = {}
    for kind in REGISTRY_HOOKS:
        entries = collect(_registry_hook(kind, pm), REGISTRY_HOOKS[kind], _namer(pm), only=name)
        if len(entries):
            found[kind] = entries
    return found


def _registry_hook(kind: str, pm: pluggy.PluginManager) -> Any:
    if kind not in REGISTRY_HOOKS:
        raise KeyError(f"unknown registry {kind!r}; known: {', '.join(sorted(REGISTRY_HOOKS))}")
    return getattr(pm.hook, f"areal_register_{kind}")


def _namer(pm: pluggy.PluginManager) -> Any:
    return lambda plugin: pm.get_name(plugin) or repr(plugin)


def list_plugins(pm: pluggy.PluginManager | None = None) -> list[PluginInfo]:
    """Every loaded plugin with its version and the hooks it implements."""
    pm = pm or get_plugin_manager()
    from areal.core.version import __version__

    infos = []
    for name, plugin in pm.list_name_plugin():
        hooks = tuple(sorted(caller.name for caller in pm.get_hookcallers(plugin) or []))
        builtin = name in DEFAULT_PLUGINS
        dist, version = ("areal", __version__) if builtin else _DIST_OF.get(name, (None, None))
        infos.append(
            PluginInfo(name=name, version=version, hooks=hooks, builtin=builtin, distribution=dist)
        )
    return sorted(infos, key=lambda p: (not p.builtin, p.name))
