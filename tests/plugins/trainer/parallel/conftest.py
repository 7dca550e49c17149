"""One real multi-process launch per world size, shared by the tests of this directory."""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from support import dist_worker


@pytest.fixture(scope="session")
def launch(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], Path]:
    """``launch(world)`` runs ``support.dist_worker`` with ``world`` gloo ranks once per test run and
    returns its output directory; a failed rank fails the test with its traceback.

    Once per run, not per pytest-xdist worker: the 4-rank launch is the suite's costliest
    (a minute and a half on 2 cores), and ``--dist loadfile`` may send test_parity.py,
    test_checkpoint.py and test_mesh.py to different workers. The first worker to ask runs it
    under a file lock in the directory all workers share; the others wait and read its files
    (the same files the first one's tests read, the same launch they would have run)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base

    def run(world: int) -> Path:
        out = shared / f"dist-world{world}"
        failed = shared / f"dist-world{world}.failed"
        with (shared / f"dist-world{world}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not out.exists() and not failed.exists():
                _launch(world, out, failed)
        if failed.exists():
            pytest.fail(failed.read_text())
        return out

    return run


def _launch(world: int, out: Path, failed: Path) -> None:
    """Run the launch into ``out``; a failure is written to ``failed`` instead (and ``out`` is
    renamed away), so every worker that asks fails with the same report."""
    partial = out.with_name(out.name + ".partial")
    try:
        proc = subprocess.run(
            dist_worker.command(str(world), str(partial)),
            capture_output=True,
            text=True,
            timeout=600,  # a hang's bound, several times the launch: never a slow machine
            env=dist_worker.env(),
        )
    except subprocess.TimeoutExpired as exc:
        failed.write_text(f"{world}-rank launch timed out after {exc.timeout} s")
        return
    errors = sorted(partial.glob("error-rank*.json"))
    if proc.returncode or errors:
        detail = errors[0].read_text() if errors else proc.stderr[-4000:]
        failed.write_text(f"{world}-rank launch failed (rc {proc.returncode}):\n{detail}")
        return
    partial.rename(out)  # complete: only now can another worker see it
