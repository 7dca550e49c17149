"""``areal plug install/uninstall`` with real pip, on examples/areal-example-reward.

Everything that installs runs in a fresh virtual environment under tmp_path, never in the one the
tests run in: a ``.pth`` file there makes this environment's packages (areal, pip, setuptools)
importable, and pip runs offline (``--no-deps --no-build-isolation``), so nothing is downloaded.
pip is slow, so one environment serves the whole module; :class:`Venv` remembers whether the
example is installed so each test can ask for the state it needs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "areal-example-reward"
OFFLINE = ["--no-deps", "--no-build-isolation", "-q"]

SETUP = "the venv `make setup` builds (python -m venv) has it"
pytest.importorskip("setuptools", reason=f"building the example needs setuptools: {SETUP}")
pytest.importorskip("pip", reason=f"areal plug install needs pip: {SETUP}")


@dataclass
class Venv:
    python: Path
    example: Path  # a copy: building must not write into the source tree
    workdir: Path
    installed: bool = False

    def run(
        self, *args: str, check: bool = False, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("AREAL_", "PIP_"))}
        result = subprocess.run(
            [str(self.python), *args],
            capture_output=True,
            text=True,
            env={**base, "PIP_NO_INDEX": "1", "NO_COLOR": "1", "COLUMNS": "200", **(env or {})},
            cwd=self.workdir,
            timeout=120,
        )
        if check:
            assert result.returncode == 0, result.stderr
        return result

    def areal(
        self, *args: str, check: bool = False, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.run("-m", "areal", *args, check=check, env=env)

    def areal_json(self, *args: str) -> Any:
        return json.loads(self.areal(*args, "--json", check=True).stdout)

    def ensure_installed(self) -> dict[str, Any]:
        """Install the example (a regular install) unless it is already there."""
        report: dict[str, Any] = {}
        if not self.installed:
            report = self.areal_json("plug", "install", str(self.example), *OFFLINE)
            self.installed = True
        return report

    def ensure_uninstalled(self) -> None:
        if self.installed:
            self.areal("plug", "uninstall", "example-reward", "-q", check=True)
            self.installed = False


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    base = tmp_path_factory.mktemp("plug")
    target = base / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(target)],
        check=True,
        timeout=120,
    )
    python = target / "bin" / "python"
    # Under a venv, --system-site-packages reaches the base interpreter's packages, not ours.
    theirs = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    lines = [f"import site; site.addsitedir({path!r})" for path in sorted(ours)]
    (Path(theirs) / "_areal_test_parent.pth").write_text("\n".join(lines) + "\n")
    example = base / "areal-example-reward"
    shutil.copytree(
        EXAMPLE, example, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    return Venv(python=python, example=example, workdir=base)


def _third_party(plugins: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in plugins if not p["builtin"]}


HOOKS = ["areal_register_commands", "areal_register_monitor_panels", "areal_register_rewards"]


def test_install_reports_the_three_hooks_and_what_they_register(venv: Venv) -> None:
    venv.ensure_uninstalled()
    report = venv.ensure_installed()
    assert report["distribution"] == "areal-example-reward"
    assert report["version"] == "0.1.0"
    (plugin,) = report["plugins"]
    assert plugin["name"] == "example-reward"
    assert plugin["hooks"] == HOOKS
    assert plugin["loaded"] is True
    assert plugin["registers"] == {
        "rewards": ["concise_answer"],
        "monitor_panels": ["reward-trend"],
    }
    assert plugin["commands"] == ["example-reward"]


def test_list_shows_it_with_version_and_hooks(venv: Venv) -> None:
    venv.ensure_installed()
    found = _third_party(venv.areal_json("plug", "list"))
    assert found["example-reward"]["version"] == "0.1.0"
    assert found["example-reward"]["distribution"] == "areal-example-reward"
    assert found["example-reward"]["hooks"] == HOOKS


def test_reward_command_and_panel_work_from_the_installed_package(venv: Venv) -> None:
    venv.ensure_installed()
    script = textwrap.dedent(
        """
        import json
        from areal.core.plugins import registry
        from areal.core.rewards import build_reward

        reward = build_reward("concise_answer")
        panels = registry("monitor_panels").names()
        print(json.dumps({
            "right": reward(completion="The answer is 4", task={"answer": "4"}),
            "long": reward(completion="a b c d e f g 4", task={"answer": "4", "word_budget": 4}),
            "wrong": reward(completion="5", task={"answer": "4"}),
            "owner": registry("rewards").owners["concise_answer"],
            "panel": "reward-trend" in panels,
        }))
        """
    )
    values = json.loads(venv.run("-c", script, check=True).stdout)
    assert values == {
        "right": 1.0,
        "long": 0.5,
        "wrong": 0.0,
        "owner": "example-reward",
        "panel": True,
    }
    scored = venv.areal_json("example-reward", "score", "so it is 12", "--answer", "12")
    assert scored == {"reward": 1.0, "words": 4}


def test_the_plugins_own_tests_pass_against_the_installed_package(venv: Venv) -> None:
    venv.ensure_installed()
    tests = venv.example / "tests"
    result = venv.run("-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests))
    assert result.returncode == 0, result.stdout[-2000:]
    assert " passed" in result.stdout


def test_a_run_config_can_name_the_plugin_reward(venv: Venv) -> None:
    venv.ensure_installed()
    config = ROOT / "configs" / "quickstart.yaml"
    override = "agent.reward_source=concise_answer"
    ok = venv.areal("config", "validate", str(config), "--set", override)
    assert ok.returncode == 0, ok.stderr
    assert "valid" in ok.stdout
    # Where the plugin is absent (the environment the tests run in), the same config fails.
    absent = subprocess.run(
        [sys.executable, "-m", "areal", "config", "validate", str(config), "--set", override],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("AREAL_")},
        timeout=120,
    )
    assert absent.returncode == 1
    assert "agent.reward_source: unknown name 'concise_answer'" in absent.stderr
    assert len(absent.stderr.strip().splitlines()) == 1


IN_PROCESS = """
import contextlib, io, json, sys
from areal.cli.main import get_app, main
from areal.core.plugins import registry

def state():
    commands = [g.name for g in get_app().registered_groups]
    return ["concise_answer" in registry("rewards"), "example-reward" in commands]

seen = [state()]
with contextlib.redirect_stdout(io.StringIO()) as out:
    assert main(["plug", "uninstall", "example-reward", "--json"]) == 0
seen.append(json.loads(out.getvalue()))
seen.append(state())
assert main(["plug", "install", "-e", sys.argv[1], "--no-deps", "--no-build-isolation", "-q"]) == 0
seen.append(state())
import areal_example_reward
seen.append(areal_example_reward.__file__)
print(json.dumps(seen))
"""


def test_uninstall_then_editable_install_show_in_the_same_process(venv: Venv) -> None:
    venv.ensure_installed()
    out = venv.run("-c", IN_PROCESS, str(venv.example), check=True).stdout
    before, report, after_uninstall, after_install, module_file = json.loads(out.splitlines()[-1])
    assert before == [True, True]
    assert report == {
        "uninstalled": {
            "distribution": "areal-example-reward",
            "version": "0.1.0",
            "plugins": ["example-reward"],
        }
    }
    assert after_uninstall == [False, False]
    assert after_install == [True, True]
    # Editable: the code is imported from the project folder, not copied into site-packages.
    assert Path(module_file).is_relative_to(venv.example)
    # ...and a new process sees it too.
    assert "example-reward" in _third_party(venv.areal_json("plug", "list"))


def test_uninstall_removes_it(venv: Venv) -> None:
    venv.ensure_installed()
    result = venv.areal("plug", "uninstall", "areal-example-reward", "-q", check=True)
    venv.installed = False
    assert result.stdout == "uninstalled areal-example-reward 0.1.0 (plugin example-reward)\n"
    assert "example-reward" not in _third_party(venv.areal_json("plug", "list"))
    assert venv.run("-c", "import areal_example_reward").returncode == 1


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result.stdout
    lines = result.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), result.stderr
    return lines[-1]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("areal", "refusing to uninstall areal itself"),
        ("pip", "pip is not an areal plugin (it declares no 'areal' entry point)"),
        ("areal.plugins.models.register", "built into areal and cannot be uninstalled"),
        ("areal-nothing-here", "no installed plugin named 'areal-nothing-here'"),
    ],
)
def test_uninstall_refuses_what_is_not_an_installed_plugin(
    venv: Venv, name: str, expected: str
) -> None:
    assert expected in _one_line_error(venv.areal("plug", "uninstall", name))


def test_path_that_is_not_a_package_is_a_clear_error(venv: Venv, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a package")
    line = _one_line_error(venv.areal("plug", "install", str(tmp_path)))
    assert "is not a Python package (no pyproject.toml or setup.py in it)" in line
    missing = _one_line_error(venv.areal("plug", "install", "./no-such-dir"))
    assert "no such file or directory" in missing


def _tiny_project(where: Path, name: str, code: str = "", entry_point: bool = True) -> Path:
    """A one-module distribution ``areal-<name>`` (import package ``areal_<name>``)."""
    module = f"areal_{name.replace('-', '_')}"
    project = where / f"areal-{name}"
    (project / module).mkdir(parents=True)
    (project / module / "__init__.py").write_text(textwrap.dedent(code))
    entry = f'[project.entry-points.areal]\n{name} = "{module}"\n' if entry_point else ""
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=64"]\n'
        'build-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "areal-{name}"\nversion = "1.0"\n\n{entry}'
    )
    return project


def test_package_without_entry_point_says_what_to_add(venv: Venv, tmp_path: Path) -> None:
    project = _tiny_project(tmp_path, "no-entry", entry_point=False)
    try:
        line = _one_line_error(venv.areal("plug", "install", str(project), *OFFLINE))
        assert "areal-no-entry is installed but declares no 'areal' entry point" in line
        assert '[project.entry-points.areal] no-entry = "areal_no_entry"' in line
        refused = _one_line_error(venv.areal("plug", "uninstall", "areal-no-entry"))
        assert "not an areal plugin" in refused
    finally:
        venv.run("-m", "pip", "uninstall", "-y", "-q", "areal-no-entry")


CLASHING = """
from areal import hookimpl

@hookimpl
def areal_register_rewards(register):
    register("exact_match", lambda *, completion, task: 1.0)
"""

MISSPELT = """
from areal import hookimpl

@hookimpl
def areal_register_rewardz(register):
    pass
"""


@pytest.mark.parametrize(
    ("name", "code", "expected"),
    [
        (
            "clash",
            CLASHING,
            "areal-clash is installed but areal cannot load it with the other plugins: reward "
            "'exact_match' is registered twice: by areal.plugins.rewards.register and by clash",
        ),
        ("misspelt", MISSPELT, "its plugin 'misspelt' fails to load: unknown hook"),
    ],
    ids=["name-clash", "unknown-hook"],
)
def test_a_plugin_that_cannot_load_is_reported_at_install(
    venv: Venv, tmp_path: Path, name: str, code: str, expected: str
) -> None:
    project = _tiny_project(tmp_path, name, code)
    try:
        line = _one_line_error(venv.areal("plug", "install", str(project), *OFFLINE))
        assert expected in line
        assert f"areal plug uninstall areal-{name}" in line or "areal plug uninstall NAME" in line
    finally:
        venv.run("-m", "pip", "uninstall", "-y", "-q", f"areal-{name}")


def test_pip_failure_quotes_pips_error(venv: Venv) -> None:
    line = _one_line_error(venv.areal("plug", "install", "areal-no-such-plugin-xyz", "--no-deps"))
    assert line.startswith("error: pip install failed (exit 1): ERROR: ")
    assert "areal-no-such-plugin-xyz" in line


def test_uninstall_says_so_when_pip_leaves_the_plugin(venv: Venv, tmp_path: Path) -> None:
    """A plugin outside the environment (here on PYTHONPATH): pip skips it and exits 0."""
    (tmp_path / "areal_ghost").mkdir()
    (tmp_path / "areal_ghost" / "__init__.py").write_text("")
    info = tmp_path / "areal_ghost-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: areal-ghost\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[areal]\nghost = areal_ghost\n")
    (info / "RECORD").write_text("")
    result = venv.areal("plug", "uninstall", "ghost", "-q", env={"PYTHONPATH": str(tmp_path)})
    assert "pip left areal-ghost in place: it is installed outside this environment" in (
        _one_line_error(result)
    )
    assert info.is_dir()
