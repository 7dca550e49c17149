"""``areal train`` of the quickstart with another loss: ``--set algorithm.loss=sapo`` trains two
steps for real (engine, gateway, rollout worker; the nano model without the warm start and small
batches, to stay fast) and the ``[run]`` line of train.log names the loss."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import areal

REPO = Path(__file__).parents[2]


@pytest.mark.slow
@pytest.mark.serial
def test_quickstart_trains_two_steps_with_sapo(tmp_path: Path) -> None:
    env = dict(os.environ)
    # The subprocesses run the areal under test, wherever it is imported from.
    src = str(Path(areal.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    command = [
        sys.executable,
        "-m",
        "areal",
        "train",
        str(REPO / "configs" / "quickstart.yaml"),
        "--set",
        "algorithm.loss=sapo",
        "--set",
        "train.max_steps=2",
        *("--set", "warm_start.steps=0", "--set", "model.init_tiny=nano"),
        *("--set", "async.trigger_batch_size=16", "--set", "train.global_batch_size=16"),
        *("--set", "train.mini_batch_size=16", "--set", "agent.concurrency=16"),
        "--set",
        f"model.path={tmp_path / 'model'}",
        "--set",
        f"logging.log_dir={tmp_path / 'logs'}",
        "--output-dir",
        str(tmp_path / "out"),
    ]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = (tmp_path / "logs" / "train.log").read_text().splitlines()
    (run,) = [line for line in lines if line.startswith("[run] ")]
    assert run.startswith("[run] step=0 loss=sapo max_steps=2 ")
    trained = [line for line in lines if line.startswith("[train] ")]
    assert [line.split()[1] for line in trained] == ["step=1", "step=2"]
    assert "done: 2 steps, version 2" in done.stdout + done.stderr
