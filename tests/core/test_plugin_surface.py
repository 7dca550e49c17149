"""The plugin surface holds together: every register hook has a built-in implementation and a
consumer, and every registered built-in name can be reached from a run config or the CLI.

Consumers are found by scanning src/areal (a ``registry("<kind>")`` call or ``hook.<name>``
outside core/plugins.py), not from a list kept here; selectors are read off the run config's
:data:`~areal.core.run_config.NAME_KEYS` plus the few places that choose by other means (the
gateway's ``--sink``, a checkpoint's ``model_type``, the monitor). A new registry kind that nothing
selects fails :func:`test_every_registered_name_is_reachable`.
"""

from __future__ import annotations

import copy
import inspect
import io
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import pytest
from rich.console import Console
from typer.testing import CliRunner

from areal.cli.main import main, make_app
from areal.core import hookspecs
from areal.core.plugins import DEFAULT_PLUGINS, REGISTRY_HOOKS, make_plugin_manager, registry
from areal.core.run_config import (
    NAME_KEYS,
    AlgorithmConfig,
    NameKey,
    RunConfigError,
    apply_overrides,
    run_config_from_dict,
)

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "areal"
PLUGIN_MANAGER = SRC / "core" / "plugins.py"
HOOKSPECS = SRC / "core" / "hookspecs.py"
REGISTER = "areal_register_"
NOT_A_REGISTRY = {"commands"}  # areal_register_commands adds commands to the typer app

runner = CliRunner()


def hookspec_names() -> list[str]:
    marker = f"{hookspecs.PROJECT_NAME}_spec"
    return sorted(
        name
        for name, fn in vars(hookspecs).items()
        if inspect.isfunction(fn) and hasattr(fn, marker)
    )


REGISTER_HOOKS = [name for name in hookspec_names() if name.startswith(REGISTER)]


@pytest.fixture(scope="module")
def pm() -> Any:
    return make_plugin_manager(load_entry_points=False)


# --- hooks: implemented by a built-in, used by something --------------------------------------


def test_register_hooks_are_the_registries() -> None:
    kinds = {name.removeprefix(REGISTER) for name in REGISTER_HOOKS}
    assert kinds - NOT_A_REGISTRY == set(REGISTRY_HOOKS)


@pytest.mark.parametrize("hook", hookspec_names())
def test_hook_has_a_builtin_implementation(hook: str, pm: Any) -> None:
    owners = {impl.plugin_name for impl in getattr(pm.hook, hook).get_hookimpls()}
    assert owners & set(DEFAULT_PLUGINS), f"no module of DEFAULT_PLUGINS implements {hook}"


def consumers(hook: str) -> list[str]:
    """``file:line`` of each place in src/areal that gathers the hook's registry or calls it."""
    kind = hook.removeprefix(REGISTER)
    patterns = [re.compile(rf"\bhook\.{hook}\b")]
    if hook.startswith(REGISTER):
        patterns.append(re.compile(rf"\bregistry\(\s*[\"']{re.escape(kind)}[\"']"))
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path in (PLUGIN_MANAGER, HOOKSPECS):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if any(p.search(line) for p in patterns):
                found.append(f"{path.relative_to(SRC)}:{number}")
    return found


@pytest.mark.parametrize("hook", hookspec_names())
def test_hook_has_a_consumer(hook: str) -> None:
    assert consumers(hook), (
        f"nothing in src/areal uses {hook}: no registry({hook.removeprefix(REGISTER)!r}) call "
        "and no hook call outside core/plugins.py"
    )


def test_the_consumer_scan_sees_calls() -> None:
    assert any(c.startswith("core/tasks.py:") for c in consumers("areal_register_task_sets"))
    assert any(c.startswith("cli/main.py:") for c in consumers("areal_register_commands"))
    assert any(c.startswith("core/agent_choice.py:") for c in consumers("areal_wrap_agent"))


# --- every registered name has a selector -------------------------------------------------------


def _base_config() -> dict[str, Any]:
    return {
        "model": {"path": "m"},
        "dataset": {"name": registry("task_sets").names()[0]},
        # the reward sources that call the router's judge or reward model need a router config
        "agent": {"gateway_config": "router.yaml"},
    }


def config_errors(key: str, value: str) -> list[str]:
    data = apply_overrides(copy.deepcopy(_base_config()), [f"{key}={value}"])
    try:
        run_config_from_dict(data, source="")
    except RunConfigError as err:
        return err.errors
    return []


def _as_value(name_key: NameKey, name: str) -> str:
    return f"[{name}]" if name_key.key == "logging.metric_sinks" else name


def _covers(name_key: NameKey, name: str) -> bool:
    return name.startswith(name_key.prefix) if name_key.prefix else "/" not in name


def by_config_keys(kind: str, names: list[str]) -> set[str]:
    """Names some run config key of NAME_KEYS accepts; each such key refuses ``nope`` in one
    line that names the key and lists what it accepts."""
    covered = set()
    for name_key in (k for k in NAME_KEYS if k.kind == kind):
        mine = [n for n in names if _covers(name_key, n)]
        for name in mine:
            value = name.removeprefix(name_key.prefix)
            assert config_errors(name_key.key, _as_value(name_key, value)) == [], name_key.key
            covered.add(name)
        errors = config_errors(name_key.key, _as_value(name_key, "nope"))
        assert len(errors) == 1 and "\n" not in errors[0], errors
        assert errors[0].startswith(f"{name_key.key}: unknown name 'nope'; known: ")
        listed = errors[0].split("; known: ")[1].split(", ")
        assert {n.removeprefix(name_key.prefix) for n in mine} <= set(listed)
    return covered


def by_algorithm_literal(field_name: str, prefix: str) -> Callable[[list[str]], set[str]]:
    """``{prefix}<name>`` losses chosen by the literal field ``algorithm.<field_name>: <name>``
    (``proximal/`` by ``prox_logp``, ``advantage_norm/`` by ``advantage_norm``)."""

    def covered_by(names: list[str]) -> set[str]:
        field = AlgorithmConfig.model_fields[field_name]
        covered = set()
        for name in (n for n in names if n.startswith(prefix)):
            choice = name.removeprefix(prefix)
            assert choice in get_args(field.annotation)
            assert config_errors(f"algorithm.{field_name}", choice) == []
            covered.add(name)
        assert config_errors(f"algorithm.{field_name}", "nope")
        return covered

    return covered_by


def queues_by_gateway_sink(names: list[str]) -> set[str]:
    """``--sink NAME`` of ``areal serve gateway`` / ``python -m areal.gateway.server``; the
    trainer's end ``NAME/source`` comes with its sink."""
    from areal.gateway.training_flags import TrainingFlags

    covered = set()
    for name in names:
        sink, _, end = name.partition("/")
        assert end in ("", "source"), name
        assert sink in names, f"{name}: the source of a queue that has no sink"
        TrainingFlags(sink=sink, sink_address="tcp://127.0.0.1:5555").check()
        covered.add(name)
    with pytest.raises(ValueError, match="--sink"):
        TrainingFlags(sink="nope").check()
    return covered


def families_by_checkpoint(names: list[str]) -> set[str]:
    """A checkpoint's config.json ``model_type`` picks its family (``areal model info``, the
    trainer's loader: ``hf_io.family_for``)."""
    from areal.plugins.models.hf_io import family_for

    families = registry("model_families")
    for name in names:
        types = families.get(name).hf_model_types
        assert types and all(family_for(t).name == name for t in types), name
    with pytest.raises(ValueError, match="no model family"):
        family_for("nope")
    return set(names)


def tool_parsers_by_router_config(names: list[str]) -> set[str]:
    """``model_routing.policy_model.tool_parser`` in the router config, checked when loaded."""
    from pydantic import ValidationError

    from areal.gateway.router_config import RouterConfig

    def route(parser: str) -> dict[str, Any]:
        return {"model_routing": {"policy_model": {"model_id": "p", "tool_parser": parser}}}

    for name in names:
        RouterConfig.model_validate(route(name))
    with pytest.raises((ValidationError, ValueError)):
        RouterConfig.model_validate(route("nope"))
    return set(names)


def panels_by_monitor(names: list[str]) -> set[str]:
    """``areal monitor`` draws every registered panel."""
    from areal.cli.monitor.live import plugin_panels
    from areal.cli.monitor.render import render
    from areal.cli.monitor.state import MonitorState

    state = MonitorState()
    panels = plugin_panels()
    console = Console(record=True, width=120, file=io.StringIO(), color_system=None)
    console.print(render(state, panels))
    text = console.export_text()
    for name in names:
        title = getattr(panels[name](state), "title", None) or name
        assert str(title) in text, name
    return set(names)


# Selectors that are not run config keys, by registry kind.
OTHER_SELECTORS: dict[str, list[Callable[[list[str]], set[str]]]] = {
    "losses": [
        by_algorithm_literal("prox_logp", "proximal/"),
        by_algorithm_literal("advantage_norm", "advantage_norm/"),
    ],
    "queues": [queues_by_gateway_sink],
    "model_families": [families_by_checkpoint],
    "tool_parsers": [tool_parsers_by_router_config],
    "monitor_panels": [panels_by_monitor],
}


@pytest.mark.parametrize("kind", sorted(REGISTRY_HOOKS))
def test_every_registered_name_is_reachable(kind: str) -> None:
    names = registry(kind).names()
    assert names, f"nothing built in registers a {REGISTRY_HOOKS[kind]}"
    covered = by_config_keys(kind, names)
    for select in OTHER_SELECTORS.get(kind, []):
        covered |= select(names)
    missing = sorted(set(names) - covered)
    assert not missing, (
        f"registered {kind} {missing} cannot be chosen from a run config (NAME_KEYS) or the CLI; "
        "add the config key or CLI option a user would expect"
    )


# --- the engine end to end, through the real CLI ------------------------------------------------


def test_plug_info_lists_the_fsdp_engine_and_its_alias() -> None:
    """``archon`` (the seed article's name) is shown as an alias of fsdp, not as a second engine."""
    args = ["plug", "info", "areal.plugins.trainer.register"]
    as_json = runner.invoke(make_app(), [*args, "--json"])
    assert as_json.exit_code == 0, as_json.output
    details = json.loads(as_json.stdout)
    assert details["registers"] == {"engines": ["fsdp"]}
    assert details["aliases"] == {"engines": {"archon": "fsdp"}}
    table = runner.invoke(make_app(), args)
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    registers = [line for line in lines if "registers: engines" in line]
    assert len(registers) == 1 and "fsdp" in registers[0] and "archon" not in registers[0]
    assert any("aliases: engines" in line and "archon = fsdp" in line for line in lines)
    models = runner.invoke(make_app(), ["plug", "info", "areal.plugins.models.register", "--json"])
    assert json.loads(models.stdout)["aliases"] == {}  # no aliases: an empty mapping


def test_an_unknown_engine_is_one_line_naming_the_key_and_the_engines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = ROOT / "configs" / "quickstart.yaml"
    assert main(["config", "validate", str(config), "--set", "train.engine=nope"]) == 1
    captured = capsys.readouterr()
    known = ", ".join(registry("engines").names())
    assert captured.out == ""
    assert captured.err == f"error: {config}: train.engine: unknown name 'nope'; known: {known}\n"
    assert "fsdp" in known


def test_engines_name_only_registered_model_families() -> None:
    """An engine's ``model_families`` are registry names (empty: every registered family)."""
    families = set(registry("model_families").names())
    for name, engine in registry("engines").entries.items():
        unknown = set(getattr(engine, "model_families", ())) - families
        assert not unknown, f"engine {name!r} names unregistered model families {sorted(unknown)}"
