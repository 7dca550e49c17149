"""``AREAL_TRACE_PLUGINS=1`` writes every hook call with the plugins that answered, the arguments
and the results, keys removed (datasette's ``DATASETTE_TRACE_PLUGINS``)."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from areal import hookimpl
from areal.core.plugin_trace import trace_hook_calls
from areal.core.plugins import make_plugin_manager, registry


class Shouter:
    @hookimpl
    def areal_register_losses(self, register):  # type: ignore[no-untyped-def]
        register("shout", lambda: "sk-abcdefghijklmnopqrstuvwxyz")
        return "sk-abcdefghijklmnopqrstuvwxyz"  # what a careless plugin might hand back


def test_each_hook_call_is_one_line_with_its_plugins_arguments_and_results() -> None:
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(Shouter(), name="shouter")
    out = io.StringIO()
    trace_hook_calls(pm, out)
    seen: list[str] = []
    pm.hook.areal_register_losses(register=lambda name, thing: seen.append(name))
    (line,) = out.getvalue().splitlines()
    assert line.startswith("areal-trace areal_register_losses(register=<function ")
    assert " by shouter, areal.plugins.losses.register -> [" in line
    assert "sk-***" in line and "abcdefghijklmnop" not in line  # a key never reaches the trace
    assert line.endswith(" ms")
    assert "shout" in seen


def test_a_hook_that_raises_is_traced_and_still_raises() -> None:
    class Broken:
        @hookimpl
        def areal_register_losses(self, register):  # type: ignore[no-untyped-def]
            raise RuntimeError("no losses today")

    pm = make_plugin_manager(load_entry_points=False)
    pm.register(Broken(), name="broken")
    out = io.StringIO()
    trace_hook_calls(pm, out)
    with pytest.raises(RuntimeError, match="no losses today"):
        pm.hook.areal_register_losses(register=lambda name, thing: None)
    assert "-> raised RuntimeError: 'no losses today'" in out.getvalue()


def test_the_registries_calls_and_registrations_are_traced_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AREAL_TRACE_PLUGINS", "1")
    losses = registry("losses", make_plugin_manager(load_entry_points=False))
    traced = capsys.readouterr().err.splitlines()
    assert any(
        line.startswith("areal-trace areal_register_losses(register=")
        and "by areal.plugins.losses.register -> None" in line
        for line in traced
    ), traced
    for name in losses.names():
        assert any(
            line.startswith(f"areal-trace register loss(name='{name}', thing=") for line in traced
        ), name


def test_the_variable_turns_it_on_for_a_real_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "areal", "plug", "list", "--json"],
        env={**os.environ, "AREAL_TRACE_PLUGINS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    traced = [line for line in done.stderr.splitlines() if line.startswith("areal-trace ")]
    assert any(line.startswith("areal-trace areal_register_") for line in traced), done.stderr
    quiet = subprocess.run(
        [sys.executable, "-m", "areal", "plug", "list", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "areal-trace" not in quiet.stderr
