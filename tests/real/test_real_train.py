"""``areal train`` for real, 2 steps: the real model on reasoning-gym tasks by its Hub id. (A
Parquet task file read through a column mapping trains in tests/run/test_output_dir_logs.py.)

It runs ``python -m areal train`` as a user does (engine, gateway, rollout worker, trainer, each
its own process); the real model's run finds its checkpoint through the hub cache the import
wrote, offline, exactly as a downloaded model would be found.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import areal

REPO = Path(__file__).resolve().parents[2]


def areal_train(config: Path, out: Path, sets: list[str], env: dict[str, str]) -> list[str]:
    """``areal train CONFIG -o OUT --set ...`` to its end; the [train] lines of its log."""
    src = str(Path(areal.__file__).resolve().parents[1])  # the areal under test
    env = {**os.environ, **env}
    env["PYTHONPATH"] = os.pathsep.join([src, str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    command = [sys.executable, "-m", "areal", "train", str(config), "-o", str(out)]
    command += [arg for value in sets for arg in ("--set", value)]
    done = subprocess.run(
        command, cwd=out.parent, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = (out / "logs" / "train.log").read_text().splitlines()
    return [line for line in log if line.startswith("[train] ")]


def field(line: str, name: str) -> float:
    return float(next(p for p in line.split() if p.startswith(name + "=")).partition("=")[2])


@pytest.mark.slow
@pytest.mark.serial
def test_the_real_model_trains_two_steps_on_reasoning_gym(real_model: Any, tmp_path: Path) -> None:
    sets = [
        f"model.path={real_model.hub_id}",  # resolved in the import's hub cache, offline
        "train.max_steps=2",
        "train.global_batch_size=4",
        "train.mini_batch_size=4",
        "algorithm.group_size=2",
        "async.trigger_batch_size=4",
        "agent.concurrency=4",
        "sampling.max_new_tokens=12",
        "logging.save_interval=100",
    ]
    env = {"HF_HUB_CACHE": str(real_model.cache), "HF_HUB_OFFLINE": "1"}
    lines = areal_train(REPO / "configs" / "real.yaml", tmp_path / "out", sets, env)
    assert [line.split()[1] for line in lines] == ["step=1", "step=2"]
    for line in lines:
        assert field(line, "updated") == 4
        assert 0.0 <= field(line, "success") <= 1.0
    # the embedded engine's log-probs are the trainer's at step 1 (same weights, same softmax)
    assert abs(field(lines[0], "behave_approx_kl")) < 1e-3
