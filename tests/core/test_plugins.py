"""The plugin manager: built-ins, real third-party plugins from entry points, env switches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from areal import hookimpl
from areal.core.plugins import (
    DEFAULT_PLUGINS,
    REGISTRY_HOOKS,
    list_plugins,
    make_plugin_manager,
    normalize_name,
    plugin_contributions,
    registry,
)
from areal.core.registry import RegistryError
from areal.core.specs import InferenceBackend, ModelFamily


@pytest.fixture
def pm(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("AREAL_BLOCK_PLUGINS", raising=False)
    monkeypatch.delenv("AREAL_LOAD_PLUGINS", raising=False)
    return make_plugin_manager(load_entry_points=False)


def test_builtins_load_through_the_hooks(pm) -> None:
    names = {p.name for p in list_plugins(pm) if p.builtin}
    assert names == set(DEFAULT_PLUGINS)
    families = registry("model_families", pm)
    assert {"llama", "qwen2", "qwen3", "qwen3_moe"} <= set(families.names())
    assert families.owners["qwen3"] == "areal.plugins.models.register"
    assert isinstance(families.get("qwen3"), ModelFamily)
    backends = registry("inference_backends", pm)
    assert isinstance(backends.get("embedded"), InferenceBackend)
    assert backends.get("sglang").needs_gpu


def test_unknown_registry_kind(pm) -> None:
    with pytest.raises(KeyError, match="known: adapters"):
        registry("lossez", pm)


class EveryRegistry:
    """A third-party style plugin object that adds one thing through every register hook."""

    @hookimpl
    def areal_register_model_families(self, register):
        register("demo", ModelFamily("demo", ("demo",), "m:Model", "m:Config"))

    @hookimpl
    def areal_register_inference_backends(self, register):
        register("vllm-ish", InferenceBackend("vllm-ish", launcher="m:build"))

    @hookimpl
    def areal_register_tool_parsers(self, register):
        register("demo-xml", "parser")

    @hookimpl
    def areal_register_engines(self, register):
        register("demo-engine", "engine")

    @hookimpl
    def areal_register_losses(self, register):
        register("demo-loss", "loss")

    @hookimpl
    def areal_register_rewards(self, register):
        register("demo-reward", "reward")

    @hookimpl
    def areal_register_queues(self, register):
        register("demo-queue", "queue")

    @hookimpl
    def areal_register_metric_sinks(self, register):
        register("demo-sink", "sink")

    @hookimpl
    def areal_register_adapters(self, register):
        register("demo-adapter", "adapter")

    @hookimpl
    def areal_register_task_sets(self, register):
        register("demo-tasks", "task set")

    @hookimpl
    def areal_register_launchers(self, register):
        register("demo-launcher", "launcher")

    @hookimpl
    def areal_register_monitor_panels(self, register):
        register("demo-panel", lambda view: "panel")


def test_every_register_hook_fills_its_registry(pm) -> None:
    pm.register(EveryRegistry(), name="areal-every")
    for kind in REGISTRY_HOOKS:
        reg = registry(kind, pm)
        mine = [n for n, owner in reg.owners.items() if owner == "areal-every"]
        assert len(mine) == 1, kind
    contributions = plugin_contributions("areal-every", pm)
    assert set(contributions) == set(REGISTRY_HOOKS)
    assert contributions["model_families"] == ["demo"]
    info = next(p for p in list_plugins(pm) if p.name == "areal-every")
    assert not info.builtin
    assert len(info.hooks) == len(REGISTRY_HOOKS)


def test_plugin_contributions_of_a_builtin_and_of_nothing(pm) -> None:
    assert plugin_contributions("areal.plugins.models.register", pm) == {
        "model_families": ["llama", "qwen2", "qwen3", "qwen3_moe"]
    }
    with pytest.raises(RegistryError, match="no plugin named 'ghost'"):
        plugin_contributions("ghost", pm)


class ClashingFamily:
    @hookimpl
    def areal_register_model_families(self, register):
        register("llama", ModelFamily("llama", ("llama",), "x:Y", "x:Z"))


def test_duplicate_name_from_two_plugins_names_both(pm) -> None:
    pm.register(ClashingFamily(), name="areal-my-llama")
    with pytest.raises(RegistryError) as err:
        registry("model_families", pm)
    message = str(err.value)
    assert "model family 'llama' is registered twice" in message
    assert "areal.plugins.models.register" in message
    assert "areal-my-llama" in message


def test_unknown_name_lists_registered_and_config_key(pm) -> None:
    backends = registry("inference_backends", pm)
    with pytest.raises(RegistryError) as err:
        backends.get("tensorrt", key="inference.backend")
    assert "inference.backend" in str(err.value)
    assert "registered: embedded, sglang, vllm" in str(err.value)


def test_block_plugins_removes_a_builtin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AREAL_BLOCK_PLUGINS", " areal.plugins.models.register , nothing-else")
    pm = make_plugin_manager(load_entry_points=False)
    assert pm.get_plugin("areal.plugins.models.register") is None
    assert pm.get_plugin("areal.plugins.inference.register") is not None
    assert len(registry("model_families", pm)) == 0


def test_normalize_name() -> None:
    assert normalize_name("Areal_Demo.Plugin") == "areal-demo-plugin"
    assert normalize_name("areal--demo__plugin") == "areal-demo-plugin"


class Declines:
    @hookimpl
    def areal_wrap_agent(self, agent, options):
        return None


class WrapsStrings:
    @hookimpl
    def areal_wrap_agent(self, agent, options):
        return ("wrapped", agent, options["mode"]) if isinstance(agent, str) else None


class WrapsEverything:
    @hookimpl(trylast=True)
    def areal_wrap_agent(self, agent):
        return ("fallback", agent)


def test_wrap_agent_first_non_none_wins(pm) -> None:
    pm.register(WrapsEverything(), name="fallback")
    pm.register(WrapsStrings(), name="strings")
    pm.register(Declines(), name="declines")
    hook = pm.hook.areal_wrap_agent
    assert hook(agent="agent", options={"mode": "x"}) == ("wrapped", "agent", "x")
    assert hook(agent=42, options={"mode": "x"}) == ("fallback", 42)
    pm.unregister(name="fallback")
    assert hook(agent=42, options={}) is None


# --- a real third-party plugin, installed as a distribution on sys.path ---------------------

DEMO_PLUGIN = '''
from areal import hookimpl
from areal.core.specs import ModelFamily


@hookimpl
def areal_register_model_families(register):
    register("demo", ModelFamily("demo", ("demo",), "areal_demo_plugin:M", "areal_demo_plugin:C"))


@hookimpl
def areal_register_commands(cli):
    @cli.command("demo-hello")
    def hello() -> None:
        """Say hello from a third-party plugin."""
        print("hello from areal-demo-plugin")
'''


def write_distribution(root: Path, dist: str, version: str, module: str, code: str) -> None:
    """Lay out an installed distribution by hand: its module and a .dist-info with entry points."""
    (root / module).mkdir(parents=True)
    (root / module / "__init__.py").write_text(textwrap.dedent(code))
    info = root / f"{module}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    short = dist.removeprefix("areal-")
    (info / "entry_points.txt").write_text(f"[areal]\n{short} = {module}\n")


def run_areal(root: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AREAL_")}
    clean["PYTHONPATH"] = str(root)
    return subprocess.run(
        [sys.executable, "-m", "areal", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def demo_site(tmp_path: Path) -> Path:
    write_distribution(tmp_path, "areal-demo-plugin", "0.1", "areal_demo_plugin", DEMO_PLUGIN)
    return tmp_path


def plugin_names(result: subprocess.CompletedProcess[str]) -> dict[str, dict]:
    assert result.returncode == 0, result.stderr
    return {p["name"]: p for p in json.loads(result.stdout)}


def test_third_party_plugin_loads_from_entry_points(demo_site: Path) -> None:
    plugins = plugin_names(run_areal(demo_site, "plug", "list", "--json"))
    demo = plugins["demo-plugin"]
    assert demo["version"] == "0.1"
    assert demo["distribution"] == "areal-demo-plugin"
    assert demo["builtin"] is False
    assert demo["hooks"] == ["areal_register_commands", "areal_register_model_families"]
    assert set(DEFAULT_PLUGINS) <= set(plugins)

    info = run_areal(demo_site, "plug", "info", "areal_demo_plugin", "--json")
    assert info.returncode == 0, info.stderr
    details = json.loads(info.stdout)
    assert details["registers"] == {"model_families": ["demo"]}
    assert details["commands"] == ["demo-hello"]

    hello = run_areal(demo_site, "demo-hello")
    assert hello.returncode == 0, hello.stderr
    assert hello.stdout.strip() == "hello from areal-demo-plugin"


@pytest.mark.parametrize(
    "env",
    [
        {"AREAL_LOAD_PLUGINS": ""},
        {"AREAL_LOAD_PLUGINS": "areal-other"},
        {"AREAL_BLOCK_PLUGINS": "areal-demo-plugin"},
        {"AREAL_BLOCK_PLUGINS": "demo-plugin"},
    ],
)
def test_env_vars_exclude_a_third_party_plugin(demo_site: Path, env: dict[str, str]) -> None:
    plugins = plugin_names(run_areal(demo_site, "plug", "list", "--json", **env))
    assert "demo-plugin" not in plugins
    assert set(DEFAULT_PLUGINS) <= set(plugins)


def test_load_plugins_names_compare_like_package_names(demo_site: Path) -> None:
    plugins = plugin_names(
        run_areal(demo_site, "plug", "list", "--json", AREAL_LOAD_PLUGINS="Areal_Demo_Plugin")
    )
    assert "demo-plugin" in plugins


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("raise ImportError('needs libfoo')", "plugin 'broken' (from areal-broken) failed to load"),
        (
            "from areal import hookimpl\n@hookimpl\ndef areal_register_lossez(register): pass\n",
            "unknown hook 'areal_register_lossez'",
        ),
    ],
)
def test_a_broken_plugin_is_one_clear_line(tmp_path: Path, code: str, expected: str) -> None:
    write_distribution(tmp_path, "areal-broken", "0.2", "areal_broken", code)
    result = run_areal(tmp_path, "plug", "list")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert expected in lines[0]
    assert "Traceback" not in result.stderr
