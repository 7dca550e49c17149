"""The ``areal`` command: help, version, plugin listing, one-line errors, no torch on --help."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from areal import __version__, hookimpl
from areal.cli.errors import CLIError
from areal.cli.main import main, make_app, report_error
from areal.core.plugins import DEFAULT_PLUGINS, PluginError, make_plugin_manager
from support.cli import areal_script

runner = CliRunner()


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AREAL_")}


def test_python_dash_m_areal_help() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "areal", "--help"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    for name in ("version", "plug", "model", "serve", "--debug", "Example"):
        assert name in result.stdout


def test_console_script_version() -> None:
    script = areal_script()
    plain = subprocess.run(
        [str(script), "version"], capture_output=True, text=True, env=_env(), timeout=60
    )
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.startswith(f"areal {__version__} ")
    as_json = subprocess.run(
        [str(script), "version", "--json"], capture_output=True, text=True, env=_env(), timeout=60
    )
    info = json.loads(as_json.stdout)
    assert info["areal"] == __version__
    assert info["python"] == ".".join(map(str, sys.version_info[:3]))


NO_TORCH_SCRIPT = """
import sys
import areal
from typer.testing import CliRunner
from areal.cli.main import app

runner = CliRunner()
for args in (
    ["--help"], ["version"], ["plug", "--help"], ["plug", "list"],
    ["plug", "info", "areal.plugins.models.register"], ["plug", "info", "areal.cli.builtin_commands"],
    ["model", "--help"], ["model", "init-tiny", "--help"], ["model", "info", "--help"],
    ["serve", "--help"], ["serve", "inference", "--help"],
):
    result = runner.invoke(app, args)
    assert result.exit_code == 0, (args, result.output)
heavy = sorted(m for m in ("torch", "transformers", "xgrammar", "sglang") if m in sys.modules)
print("heavy:", heavy)
"""


def test_help_and_listing_never_import_torch() -> None:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(NO_TORCH_SCRIPT)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "heavy: []"


def test_plug_list_json_shows_builtins_with_hooks() -> None:
    result = runner.invoke(
        make_app(make_plugin_manager(load_entry_points=False)), ["plug", "list", "--json"]
    )
    assert result.exit_code == 0, result.output
    plugins = {p["name"]: p for p in json.loads(result.stdout)}
    assert set(plugins) == set(DEFAULT_PLUGINS)
    assert plugins["areal.plugins.models.register"]["hooks"] == ["areal_register_model_families"]
    assert plugins["areal.plugins.inference.register"]["hooks"] == [
        "areal_register_inference_backends"
    ]
    assert plugins["areal.cli.builtin_commands"]["hooks"] == ["areal_register_commands"]
    assert all(p["builtin"] and p["version"] == __version__ for p in plugins.values())


def test_plug_list_table() -> None:
    result = runner.invoke(make_app(), ["plug", "list"])
    assert result.exit_code == 0, result.output
    assert "areal.cli.builtin_commands" in result.stdout
    assert "areal_register_commands" in result.stdout


def test_plug_info_builtin() -> None:
    result = runner.invoke(make_app(), ["plug", "info", "areal.plugins.models.register"])
    assert result.exit_code == 0, result.output
    assert "qwen3_moe" in result.stdout
    as_json = runner.invoke(make_app(), ["plug", "info", "areal.cli.builtin_commands", "--json"])
    assert json.loads(as_json.stdout)["commands"] == [
        "train",
        "monitor",
        "plot",
        "probe",
        "check-channel",
        "doctor",
        "plug",
        "model",
        "serve",
        "config",
    ]


def test_error_is_one_line_without_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plug", "info", "no-such-plugin"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: no plugin named 'no-such-plugin'; loaded: ")
    assert "areal.plugins.models.register" in lines[0]


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_shows_the_traceback(
    how: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["plug", "info", "no-such-plugin"]
    if how == "flag":
        args = ["--debug", *args]
    else:
        monkeypatch.setenv("AREAL_DEBUG", "1")
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert "CLIError" in err
    assert err.strip().splitlines()[-1].startswith("error: no plugin named 'no-such-plugin'")


def test_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plug", "no-such-command"]) == 2
    assert "No such command" in capsys.readouterr().err


def test_unexpected_error_names_its_type(capsys: pytest.CaptureFixture[str]) -> None:
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(Explodes(), name="areal-explodes")
    assert main(["boom"], app=make_app(pm)) == 1
    assert capsys.readouterr().err == (
        "error: ZeroDivisionError: division by zero (run with --debug for the traceback)\n"
    )


def test_a_multi_line_message_becomes_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    report_error(
        CLIError("bad config:\n  train.max_steps: must be > 0\n\n  train.dp: must be >= 1\n"),
        debug=False,
    )
    assert (
        capsys.readouterr().err
        == "error: bad config: train.max_steps: must be > 0; train.dp: must be >= 1\n"
    )


class Explodes:
    @hookimpl
    def areal_register_commands(self, cli: typer.Typer) -> None:
        @cli.command("boom")
        def boom() -> None:
            """Fail on purpose."""
            print(1 / 0)


class Greets:
    @hookimpl
    def areal_register_commands(self, cli: typer.Typer) -> None:
        greet = typer.Typer(help="Greetings.")

        @greet.command("hi")
        def hi(name: str) -> None:
            typer.echo(f"hi {name}")

        cli.add_typer(greet, name="greet")


class StealsPlug:
    @hookimpl
    def areal_register_commands(self, cli: typer.Typer) -> None:
        cli.add_typer(typer.Typer(), name="plug")


def test_register_commands_adds_a_group_from_a_plugin() -> None:
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(Greets(), name="areal-greets")
    app = make_app(pm)
    result = runner.invoke(app, ["greet", "hi", "ada"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "hi ada\n"
    assert "greet" in runner.invoke(app, ["--help"]).stdout


def test_two_plugins_adding_one_command_name_both() -> None:
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(StealsPlug(), name="areal-steals-plug")
    with pytest.raises(PluginError) as err:
        make_app(pm)
    assert "command 'plug' is added twice" in str(err.value)
    assert "areal.cli.builtin_commands" in str(err.value)
    assert "areal-steals-plug" in str(err.value)


def test_model_init_tiny_writes_a_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "nano"
    assert main(["model", "init-tiny", str(out), "--size", "nano", "--seed", "1", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["size"] == "nano"
    assert summary["seed"] == 1
    assert (out / "config.json").exists()
    assert main(["model", "init-tiny", str(out), "--size", "nano"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "--force" in err and "\n" not in err


def test_model_init_tiny_rejects_an_unknown_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "init-tiny", "x", "--size", "huge"]) == 2
    assert "huge" in capsys.readouterr().err


def test_serve_inference_requires_a_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "inference"]) == 2
    assert "--model" in capsys.readouterr().err
