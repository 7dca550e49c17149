"""The test-support package itself: the suite's one way to wait (:func:`support.eventually`)
returns as soon as the event happens and, when it never does, says what was awaited and what it
last saw; and the path that makes ``support`` importable shadows nothing the product looks for."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support import eventually, eventually_async
from support.wait import NeverHappened


def test_it_returns_the_first_truthy_answer() -> None:
    answers = iter([None, 0, "", "ready"])
    assert eventually(lambda: next(answers), timeout=5, what="the fourth answer") == "ready"


def test_an_exception_is_not_yet_and_is_named_when_time_runs_out() -> None:
    calls = itertools.count()

    def refused() -> bool:
        next(calls)
        raise ConnectionRefusedError("nobody listens")

    with pytest.raises(NeverHappened) as failure:
        eventually(refused, timeout=0.05, what="the server to listen")
    message = str(failure.value)
    assert "the server to listen" in message
    assert "ConnectionRefusedError: nobody listens" in message
    assert next(calls) > 1  # it polled, not once


def test_the_last_answer_is_named_when_time_runs_out() -> None:
    sessions = ["s1"]
    with pytest.raises(NeverHappened, match=r"waited 0.05 s for two sessions.*last answered \[\]"):
        eventually(lambda: [s for s in sessions if s == "s2"], timeout=0.05, what="two sessions")


def test_the_async_form_keeps_the_loop_running() -> None:
    async def scenario() -> str:
        done = asyncio.Event()
        asyncio.get_running_loop().call_soon(done.set)

        async def is_set() -> bool:
            return done.is_set()

        assert await eventually_async(is_set, timeout=5, what="the event") is True
        return "ok"

    assert asyncio.run(scenario()) == "ok"


def test_no_test_folder_poses_as_a_package_the_product_looks_for() -> None:
    """``tests/`` is on ``sys.path`` (for ``support``), so each folder in it is importable as a
    namespace package wherever no real package of its name is installed: a folder named for a
    package the product probes for (``find_spec("sglang")``) would make it look installed."""
    import importlib.util

    tests = Path(__file__).parent
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    src = tests.parent / "src"
    probed = {
        name
        for path in src.rglob("*.py")
        for name in re.findall(r"find_spec\(['\"](\w+)['\"]\)", path.read_text())
    }
    assert probed, "no find_spec probes found: the scan is broken"
    posing = sorted(folders & (probed | {"areal", "torch", "vllm", "sglang", "ray"}))
    assert not posing, f"test folders named like packages the product imports or probes: {posing}"
    assert importlib.util.find_spec("support") is not None


SKIPPING = """
import pytest

def test_needs_slurm():
    pytest.skip("no slurmctld here")

@pytest.mark.gpu
def test_needs_a_gpu():
    pytest.skip("no CUDA device")

def test_runs():
    pass
"""


def _pytest_with_the_skip_rule(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    """A real pytest run of :data:`SKIPPING` with the suite's skip hooks and nothing else."""
    (tmp_path / "test_skipping.py").write_text(SKIPPING)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    if ci is not None:
        env["CI"] = ci
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "support.skips",
        "-p",
        "no:cacheprovider",
    ]
    command += ["--rootdir", str(tmp_path), "-c", os.devnull, "-m", "", str(tmp_path)]
    return subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


def test_under_ci_a_skip_fails_unless_the_test_needs_a_gpu(tmp_path: Path) -> None:
    done = _pytest_with_the_skip_rule(tmp_path, "true")
    assert done.returncode == 1, done.stdout
    assert "1 failed, 1 passed, 1 skipped" in done.stdout, done.stdout
    assert "skipped under CI=true, where only GPU tests may skip: no slurmctld here" in done.stdout
    assert "skips: 1\n" in done.stdout and "test_needs_a_gpu: no CUDA device" in done.stdout


def test_outside_ci_skips_pass_and_are_listed_with_their_reasons(tmp_path: Path) -> None:
    done = _pytest_with_the_skip_rule(tmp_path, None)
    assert done.returncode == 0, done.stdout
    assert "1 passed, 2 skipped" in done.stdout, done.stdout
    assert "skips: 2\n" in done.stdout
    assert "test_needs_slurm: no slurmctld here" in done.stdout
    assert "test_needs_a_gpu: no CUDA device" in done.stdout
