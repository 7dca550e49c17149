"""The trainer as several ranks, on real gloo ranks started by torchrun on CPU.

- ``areal train`` with ``async.train_workers: 2``: rank 0 runs the engine, gateway, rollout worker
  and trainer loop, the follower trains its shard; a dp=2 run stopped by Ctrl-C is resumed with
  tp=2 (DCP reshards); a killed follower fails a pp=2 run (after two steps through the pipeline,
  with the KL penalty on a pipelined reference). The nano model's rewards are all 0 there,
  so the weights do not move: those tests check the wiring, not the numbers.
- The numbers: this file is also the ranks' script (``__main__``): rank 0 drives a
  :class:`RankGroup` (dp=2, or pp=2: the nano's tied LM head a copy on the last stage) through
  steps with real advantages and the KL-to-reference penalty (the group loads its own reference model,
  pipelined under pp), the follower runs :func:`follow`; the published shadow is compared with
  the single-process step, and a resumed group with the one that went on.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from areal.run.checkpoint import latest_checkpoint, load_checkpoint
from areal.run.launch import torchrun_command

torch = pytest.importorskip("torch")

LR = 1e-3
STEP = {"mini_batch_size": 4, "max_grad_norm": 1.0, "behavior_weight_cap": 5.0}


def write_config(
    tmp: Path, parallelism: dict[str, Any], max_steps: int, *, pipelined: bool = False
) -> Path:
    """A run's config; ``pipelined``: the 4-layer untied nano (see :func:`_write_model`) with
    the KL penalty, whose reference model is pipelined too."""
    model: dict[str, Any] = {"path": str(tmp / "model"), "dtype": "float32", "init_tiny": "nano"}
    train_options: dict[str, Any] = {}
    if pipelined:
        _write_model(tmp / "model", untied=True)
        del model["init_tiny"]
        # Another schedule than the default, each layer recomputed in backward: the sharded
        # trainer's options as a run config gives them (several stages per rank, from a config
        # too, are test_pipeline.py's; their schedules the parity tests').
        parallelism = {**parallelism, "pipeline_schedule": "GPipe"}
        train_options = {"activation_checkpointing": True}
    data: dict[str, Any] = {
        "model": model,
        "dataset": {"name": "tool_then_answer", "seed": 0},
        "train": {
            "device": "cpu",
            "parallelism": parallelism,
            "global_batch_size": 4,
            "mini_batch_size": 4,
            "max_steps": max_steps,
            **train_options,
        },
        "algorithm": {"group_size": 2, "kl_coef": 0.05 if pipelined else 0.0},
        "sampling": {"max_new_tokens": 8},
        "inference": {"max_total_tokens": 4096},
        "async": {
            "train_workers": 2,
            "staleness_threshold": 1,
            "queue_max_size": 32,
            "trigger_batch_size": 4,
        },
        "agent": {"reward_source": "agent", "concurrency": 4, "episode_timeout_s": 60},
        "logging": {"log_dir": str(tmp / "logs"), "save_interval": 100},
    }
    path = tmp / f"run-{max_steps}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def areal_train(config: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AREAL_DIST_TIMEOUT_S": "60"}
    command = [sys.executable, "-m", "areal", "train", str(config), "-o", str(out), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)


def train_lines(tmp: Path) -> list[str]:
    lines = (tmp / "logs" / "train.log").read_text().splitlines()
    return [line for line in lines if line.startswith("[train] step=")]


def synced_versions(tmp: Path) -> list[int]:
    events = [
        json.loads(line) for line in (tmp / "logs" / "metrics.jsonl").read_text().splitlines()
    ]
    return [int(e["version"]) for e in events if e.get("event") == "sync"]


def _start(
    tmp: Path, out: Path, parallelism: dict[str, Any] | None = None
) -> tuple[subprocess.Popen[str], list[psutil.Process]]:
    """``areal train`` (dp=2, or ``parallelism``: pp runs the pipelined model) for many steps,
    once it has trained 2; with every process it started."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AREAL_DIST_TIMEOUT_S": "60"}
    parallelism = parallelism or {"dp": 2}
    config = write_config(tmp, parallelism, max_steps=1000, pipelined="pp" in parallelism)
    command = [sys.executable, "-m", "areal", "train", str(config), "-o", str(out)]
    with open(tmp / "stderr.txt", "w") as stderr:  # a file: a full pipe would block the run
        proc = subprocess.Popen(command, stderr=stderr, text=True, env=env)
    from support import eventually  # not at the top: the ranks run this file without it

    log = tmp / "logs" / "train.log"
    eventually(
        lambda: proc.poll() is not None or (log.exists() and "[train] step=2 " in log.read_text()),
        240,
        "the run reaching step 2",
    )
    assert proc.poll() is None, "the run ended before step 2"
    return proc, psutil.Process(proc.pid).children(recursive=True)


def _rank(processes: list[psutil.Process], rank: int) -> psutil.Process:
    for p in processes:
        with contextlib.suppress(psutil.Error):
            if "areal.run.train" in p.cmdline() and p.environ().get("RANK") == str(rank):
                return p
    raise AssertionError(f"no trainer rank {rank}")


@pytest.mark.serial  # an `areal train` run on two torchrun ranks
def test_two_ranks_train_stop_on_ctrl_c_and_resume_in_another_layout(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc, processes = _start(tmp_path, out)
    proc.send_signal(signal.SIGINT)  # what a terminal's Ctrl-C sends the launcher
    assert proc.wait(timeout=120) == 0, (tmp_path / "stderr.txt").read_text()[-4000:]
    _, alive = psutil.wait_procs(processes, timeout=10)  # every rank and process stopped
    assert not alive, alive
    summary = json.loads((out / "summary.json").read_text())
    steps = summary["steps"]
    assert summary["stopped_by"] == "signal" and steps >= 2
    assert len(train_lines(tmp_path)) == steps
    # The engine got every version: the trainer's [sync] events, one per step.
    assert synced_versions(tmp_path) == list(range(1, steps + 1))
    checkpoint = latest_checkpoint(out)
    assert checkpoint is not None and checkpoint.name == f"step-{steps:06d}"
    assert (checkpoint / "dcp" / ".metadata").is_file()
    assert (checkpoint / "model" / "config.json").is_file()
    assert not (checkpoint / "optimizer.pt").exists()

    # Resume with tp=2 for one more step: DCP reshards the dp=2 optimizer state.
    config = write_config(tmp_path, {"tp": 2}, max_steps=steps + 1)
    done = areal_train(config, out, "--resume")
    assert done.returncode == 0, done.stderr[-4000:]
    assert len(train_lines(tmp_path)) == steps + 1
    assert synced_versions(tmp_path)[-1] == steps + 1
    final = latest_checkpoint(out)
    assert final is not None and final.name == f"step-{steps + 1:06d}"
    assert load_checkpoint(final).state["loop"]["version"] == steps + 1
    audit = [json.loads(line) for line in (out / "run" / "trained.jsonl").open()]
    sessions = [record["session_id"] for record in audit]
    assert len(sessions) == len(set(sessions))  # nothing trained twice
    # Each step trains whole groups totalling at least the batch (4); a group restored with a
    # member lost at the Ctrl-C (no tombstone) is trained as it is, so a step may take 5.
    per_step = collections.Counter(record["step"] for record in audit)
    assert sorted(per_step) == list(range(1, steps + 2))
    assert all(4 <= n <= 5 for n in per_step.values()), per_step


@pytest.mark.serial  # an `areal train` run on two torchrun ranks
def test_a_dead_follower_fails_the_run_with_a_clear_error(tmp_path: Path) -> None:
    """Under pp=2 with the KL penalty (the run trains 2 steps through the pipeline first, its
    policy and reference each loaded stage by stage), then the follower stage is killed."""
    proc, processes = _start(tmp_path, tmp_path / "out", {"pp": 2})
    _rank(processes, 1).kill()
    assert proc.wait(timeout=120) == 1
    stderr = (tmp_path / "stderr.txt").read_text()
    # The run config's pipeline schedule and activation checkpointing reached the ranks.
    assert (
        "2 trainer ranks: pp 2 (GPipe; activation checkpointing; "
        "compute in float32, gradients reduced in float32)"
    ) in stderr
    assert "error: trainer ranks: " in stderr and "a follower rank may have died" in stderr
    _, alive = psutil.wait_procs(processes, timeout=10)  # engines, gateway, workers: all gone
    assert not alive, alive


def test_torchrun_command_single_and_multi_node(tmp_path: Path) -> None:
    config = tmp_path / "resolved.yaml"
    one = torchrun_command(4, config, tmp_path, resume=True)
    assert one[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    assert one[-5:] == ["--config", str(config), "--output-dir", str(tmp_path), "--resume"]
    extra = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "host:29500"]
    two = torchrun_command(4, config, tmp_path, resume=False, extra=extra)
    assert "--standalone" not in two
    assert two[3:5] == ["--nproc-per-node", "2"] and two[5:11] == extra
    with pytest.raises(ValueError, match=r"async\.train_workers: 3 ranks"):
        torchrun_command(3, config, tmp_path, resume=False, extra=["--nnodes=2"])


def test_a_node_of_two_gets_one_rank_and_a_command_torchrun_accepts(tmp_path: Path) -> None:
    """Node 1 of two: ``--nproc-per-node 1``, no ``--standalone`` (it would ignore the
    rendezvous), and torchrun's own parser reads the command as two nodes meeting at the
    endpoint, running ``areal.run.train`` with our arguments."""
    from torch.distributed.run import get_args_parser

    extra = ["--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "c10d"]
    extra += ["--rdzv-endpoint", "127.0.0.1:29555", "--rdzv-id", "r1"]
    command = torchrun_command(2, tmp_path / "resolved.yaml", tmp_path, resume=False, extra=extra)
    assert "--standalone" not in command
    assert command[3:5] == ["--nproc-per-node", "1"]
    args = get_args_parser().parse_args(command[3:])
    assert (args.nnodes, args.nproc_per_node, args.node_rank) == ("2", "1", 1)
    assert (args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id) == (
        "c10d",
        "127.0.0.1:29555",
        "r1",
    )
    assert not args.standalone and args.module and args.training_script == "areal.run.train"
    assert args.training_script_args == [
        "--config",
        str(tmp_path / "resolved.yaml"),
        "--output-dir",
        str(tmp_path),
    ]


@pytest.mark.serial  # two torchrun ranks
@pytest.mark.parametrize("layout", ["dp2", "pp2"])
def test_a_rank_group_trains_like_one_process_and_resumes_exactly(
    tmp_path: Path, layout: str
) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AREAL_DIST_TIMEOUT_S": "60"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", __file__, str(tmp_path), layout]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    result = torch.load(tmp_path / "result.pt")
    # dp=2 sums the gradients of two halves: fp32 rounding apart, the single-process step. Adam
    # divides by the gradient's own size, so allow a small fraction of the learning rate.
    assert result["moved"] > 0.5 * LR  # real advantages: the weights did move (measured 2 LR)
    assert result["vs_single"] < 0.005 * LR  # measured 3e-7
    assert abs(result["loss"] - result["single_loss"]) < 1e-5
    assert result["kl_ref"] == pytest.approx(result["single_kl_ref"], abs=1e-6)
    # The resumed group starts from bit-identical weights, and its optimizer state is the saved
    # one: the next step matches the group that went on.
    assert result["resumed_vs_saved"] == 0.0
    assert result["resumed_vs_continued"] < 0.05 * LR


def _samples(model: Any) -> tuple[list[Any], list[int]]:
    """8 samples of 6..20 tokens in groups of two, with different rewards."""
    from areal.core.types import Sample
    from areal.plugins.trainer.packing import pack
    from areal.plugins.trainer.step import token_logprobs

    gen = torch.Generator().manual_seed(1)
    samples = []
    for i in range(8):
        prompt, answer = 3 + i % 3, 3 + (5 * i) % 12
        ids = torch.randint(10, 4000, (prompt + answer,), generator=gen).tolist()
        s = Sample(ids, [0] * prompt + [1] * answer, [0.0] * len(ids), [-1] * prompt + [0] * answer)
        s.reward = float(i % 3)
        samples.append(s)
    (p,) = pack(samples)
    with torch.no_grad():  # off-policy by a little: the KL to the reference is not 0
        lp = (token_logprobs(model, p) + 0.05 * torch.randn(p.n_tokens, generator=gen)).tolist()
    for i, s in enumerate(samples):
        start = int(p.cu_seqlens[i])
        values = lp[start : start + len(s.input_ids) - 1]
        s.logprobs = [0.0] + [v if m else 0.0 for v, m in zip(values, s.loss_mask[1:], strict=True)]
    return samples, [i // 2 for i in range(8)]


def _max_diff(a: Any, b: Any) -> float:
    sa, sb = a.state_dict(), b.state_dict()
    return max(float((sa[k] - sb[k]).abs().max()) for k in sa)


def _write_model(model_dir: Path, *, untied: bool = False) -> None:
    """The nano checkpoint (its LM head tied to the embedding); ``untied``: with 4 layers and
    an untied LM head."""
    import dataclasses

    from areal.plugins.models.hf_io import save_model
    from areal.plugins.models.qwen3 import Qwen3ForCausalLM
    from areal.plugins.models.tiny import init_tiny, tiny_config

    init_tiny(model_dir, size="nano")
    if untied:
        config = tiny_config("nano")
        config = dataclasses.replace(config, tie_word_embeddings=False, num_hidden_layers=4)
        model = Qwen3ForCausalLM(config)
        model.init_weights(generator=torch.Generator().manual_seed(0))
        save_model(model, model_dir)


def _ranks_main(out: Path, layout: str) -> None:
    """Both ranks' script (see the module docstring); rank 0 writes ``result.pt``."""
    import copy

    import torch.distributed as dist

    from areal.core.run_config import run_config_from_dict
    from areal.core.train_engine import EngineSetup
    from areal.plugins.models.hf_io import load_model
    from areal.plugins.trainer.ranks import RankGroup, Start, follow, init_ranks
    from areal.plugins.trainer.step import train_step

    config = EngineSetup.from_config(
        run_config_from_dict(
            {
                "model": {"path": str(out / "model"), "dtype": "float32"},
                "dataset": {"name": "tool_then_answer"},
                "train": {
                    "device": "cpu",
                    "parallelism": {layout[:2]: 2},
                    "learning_rate": LR,
                },
                "async": {"train_workers": 2},
            }
        ),
        out,
    )
    if int(os.environ["RANK"]):
        follow(config)
        return
    _write_model(out / "model")
    ranks = init_ranks(config)
    # With the KL term: the group shards its own reference model (the starting weights).
    model_dir = str(out / "model")
    group = RankGroup(ranks, config, Start(weights_dir=model_dir, reference_dir=model_dir))
    single = load_model(out / "model").train()
    start = copy.deepcopy(single)
    optimizer = torch.optim.AdamW(single.parameters(), lr=LR, weight_decay=0.0)
    samples, groups = _samples(single)
    kwargs = {**STEP, "group_ids": groups, "current_version": 0, "kl_coef": 0.1}
    stats = group.step(samples, kwargs)
    reference = load_model(out / "model").requires_grad_(False)
    single_stats = train_step(single, optimizer, samples, reference=reference, **kwargs)
    shadow = group.gather()
    result = {
        "loss": stats["loss"],
        "single_loss": single_stats["loss"],
        "kl_ref": stats["kl_ref"],
        "single_kl_ref": single_stats["kl_ref"],
        "moved": _max_diff(shadow, start),
        "vs_single": _max_diff(shadow, single),
    }
    group.save(out / "dcp", 1)
    saved = copy.deepcopy(shadow)
    group.step(samples, {**kwargs, "current_version": 1})
    continued = copy.deepcopy(group.gather())
    # A new group (as after --resume) from the saved weights and the sharded optimizer.
    save_dir = out / "saved"
    from areal.plugins.models.hf_io import save_model

    save_model(saved, save_dir)
    resume = Start(weights_dir=str(save_dir), reference_dir=model_dir, resume_dir=str(out / "dcp"))
    resumed = RankGroup(ranks, config, resume)
    result["resumed_vs_saved"] = _max_diff(resumed.gather(), saved)
    resumed.step(samples, {**kwargs, "current_version": 1})
    result["resumed_vs_continued"] = _max_diff(resumed.gather(), continued)
    resumed.stop()
    torch.save(result, out / "result.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    _ranks_main(Path(sys.argv[1]), sys.argv[2])


def test_a_checkpoint_resumes_only_with_its_own_kind_of_trainer(tmp_path: Path) -> None:
    from areal.core.train_engine import EngineError
    from areal.plugins.trainer.engine import _check_resumable

    one, many = tmp_path / "one", tmp_path / "many"
    (one / "model").mkdir(parents=True)
    (one / "optimizer.pt").write_bytes(b"")
    (many / "dcp").mkdir(parents=True)
    _check_resumable(one, several=False)
    _check_resumable(many, several=True)
    with pytest.raises(EngineError, match=r"one trainer rank .* async\.train_workers: 1"):
        _check_resumable(one, several=True)
    with pytest.raises(EngineError, match=r"several trainer ranks .* async\.train_workers > 1"):
        _check_resumable(many, several=False)
