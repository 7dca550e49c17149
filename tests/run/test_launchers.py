"""Launchers as plugins: a third-party launcher registered through ``areal_register_launchers``
places a supervised child (its wrapped command runs, the supervisor's restart rule holds);
``launcher.name`` and ``launcher.options`` are checked with the key named."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from areal.core.launcher import LocalLauncher, Placement, launcher_for
from areal.core.run_config import RunConfigError, load_run_config
from areal.run.supervisor import Child, Supervisor
from support import eventually

QUICKSTART = Path(__file__).parents[2] / "configs" / "quickstart.yaml"

TAGGING_LAUNCHER = '''
import sys
import time
from areal import hookimpl
from areal.core.launcher import LauncherSpec


class Tagging:
    """Runs every command with its role and a tag in the environment (``env`` does it)."""

    name = "tagging"

    def __init__(self, options, config):
        self.tag = options["tag"]

    def wrap(self, placement, command):
        return ["env", f"PLACED_AS={placement.role}:{placement.name}:{self.tag}", *command]

    def describe(self, placement):
        return f"tagged {self.tag}"


@hookimpl
def areal_register_launchers(register):
    register("tagging", LauncherSpec(name="tagging", factory="tagging_launcher:Tagging"))
'''

PRINT_AND_EXIT = [
    sys.executable, "-c", "import os, sys; print(os.environ['PLACED_AS'], flush=True); sys.exit(1)"
]  # fmt: skip


@pytest.mark.serial
def test_a_plugins_launcher_places_the_supervised_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from areal.core.plugins import get_plugin_manager

    (tmp_path / "tagging_launcher.py").write_text(TAGGING_LAUNCHER)
    monkeypatch.syspath_prepend(str(tmp_path))
    import tagging_launcher  # type: ignore[import-not-found]

    pm = get_plugin_manager()
    pm.register(tagging_launcher, name="tagging-launcher")
    try:
        config = load_run_config(
            QUICKSTART, ["launcher.name=tagging", "launcher.options={tag: blue}"]
        )
        launcher = launcher_for(config)
        log = tmp_path / "engine0.log"
        child = Child(
            name="engine0",
            command=lambda: PRINT_AND_EXIT,
            log_path=log,
            placement=Placement("engine0", "engine"),
            max_restarts=1,
        )
        supervisor = Supervisor([child], poll_interval=0.05, launcher=launcher)

        async def scenario() -> str:
            await supervisor.start_all()
            try:
                await asyncio.wait_for(supervisor.watch(), timeout=30)
            except Exception as err:  # the child exits every time: restarted once, then given up
                return str(err)
            return ""

        failure = asyncio.run(scenario())
    finally:
        pm.unregister(name="tagging-launcher")
        supervisor.stop_all(timeout=2)
    assert "engine0 exited with code 1 and was already restarted 1 times" in failure
    assert log.read_text().count("engine:engine0:blue") >= 1  # the wrapped command ran


def test_the_local_launcher_runs_commands_as_they_are() -> None:
    placement = Placement("gateway", "gateway")
    assert LocalLauncher().wrap(placement, ["areal", "serve"]) == ["areal", "serve"]
    with pytest.raises(ValueError, match=r"launcher\.options: the local launcher has no options"):
        LocalLauncher({"address": "x"})


def test_an_unknown_launcher_lists_the_known_ones() -> None:
    with pytest.raises(RunConfigError) as caught:
        load_run_config(QUICKSTART, ["launcher.name=kubernetes"])
    assert "launcher.name" in str(caught.value) and "local" in str(caught.value)
    assert "ray" in str(caught.value)


def test_ray_options_are_checked_with_the_key_named() -> None:
    bad = load_run_config(QUICKSTART, ["launcher.name=ray", "launcher.options={cpus: {engine: x}}"])
    with pytest.raises(ValueError, match=r"launcher\.options\.cpus\.engine: "):
        launcher_for(bad)
    config = load_run_config(
        QUICKSTART,
        ["launcher.name=ray", "launcher.options={resources: {engine: {inference: 1}}}"],
    )
    launcher = launcher_for(config)
    wrapped = launcher.wrap(Placement("engine0", "engine"), ["serve", "--port", "9"])
    assert wrapped[1:3] == ["-m", "areal.plugins.launchers.ray_exec"]
    assert wrapped[wrapped.index("--") :] == ["--", "serve", "--port", "9"]
    assert wrapped[wrapped.index("--resources") + 1] == '{"inference": 1.0}'
    assert "--spread" in wrapped  # engines go over the nodes by default; the rest may pack
    assert "--spread" not in launcher.wrap(Placement("gateway", "gateway"), ["g"])
    assert launcher.describe(Placement("engine0", "engine")) == (
        "Ray actor 'engine0' on a node with 1 CPU, 1 inference"
    )


def test_a_launchers_stop_signal_is_what_stops_its_children(tmp_path: Path) -> None:
    """srun turns SIGTERM into a SIGKILL of the step, so the slurm launcher stops with SIGINT."""

    class Interrupting(LocalLauncher):
        name = "interrupting"
        stop_signal = signal.SIGINT

    program = (
        "import signal, sys\n"
        "signal.signal(signal.SIGINT, lambda *a: (print('got SIGINT', flush=True), sys.exit(0)))\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('got SIGTERM', flush=True), sys.exit(1)))\n"
        "print('up', flush=True)\n"
        "signal.pause()\n"
    )
    log = tmp_path / "gateway.log"
    child = Child(
        name="gateway",
        command=lambda: [sys.executable, "-c", program],
        log_path=log,
        placement=Placement("gateway", "gateway"),
    )
    supervisor = Supervisor([child], poll_interval=0.05, launcher=Interrupting())
    asyncio.run(supervisor.start_all())
    eventually(lambda: "up" in log.read_text(), 60, "the child's handlers set ('up' in its log)")
    supervisor.stop_all(timeout=10)
    assert "got SIGINT" in log.read_text() and "got SIGTERM" not in log.read_text()
    assert child.process is not None and child.process.returncode == 0
