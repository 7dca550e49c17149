"""The reference venv (``.venv/refs``: AReaL 1.0.4 and verl 0.9.1 from PyPI, ``make setup``) and
the one way the reference tests call into it: a batch of calls through ``runner.py``.

``areal`` is also our package's name, so the references live in a venv of their own and run in a
subprocess; inputs and outputs travel as ``torch.save`` files, so float64 values arrive bit for
bit. A missing venv fails the test (never skips): ``make setup`` builds it.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

import pytest
import torch

from references.common import RUNNER, Calls, RunReference, refs_python


@pytest.fixture(scope="module")
def run_reference(tmp_path_factory: pytest.TempPathFactory) -> RunReference:
    """Runs a batch of calls (``runner.py``'s format) in the reference venv; one process per
    batch, since importing verl takes seconds."""
    python = refs_python()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def run(calls: Calls) -> list[dict[str, Any]]:
        folder = tmp_path_factory.mktemp("refs")
        job, out = folder / "job.pt", folder / "out.pt"
        torch.save(calls, job)
        result = subprocess.run(
            [str(python), str(RUNNER), str(job), str(out)],
            capture_output=True,
            text=True,
            env=env,
            cwd=folder,
            timeout=600,
        )
        assert result.returncode == 0, f"the reference runner failed:\n{result.stderr[-4000:]}"
        answers: list[dict[str, Any]] = torch.load(out, weights_only=False)
        return answers

    return run
