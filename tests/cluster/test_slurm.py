"""The Slurm launcher on a real one-node Slurm cluster (``slurm_cluster``, tests/cluster/conftest):
the sbatch script it writes, srun steps started by ``SlurmLauncher.wrap`` inside a job, and a
whole ``areal train`` run submitted with ``submit``. The script's multi-node lines are checked
by reading the script (one node here)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import areal
from areal.core.config import ConfigError
from areal.core.run_config import RunConfig, load_run_config
from areal.host.on_node import node_address
from areal.plugins.launchers.slurm import (
    Placement,
    SlurmLauncher,
    SlurmOptions,
    factory,
    node_lines,
    parse_options,
    sbatch_script,
    submit,
    submit_with,
)
from support import eventually
from support.runs import small

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SRC = str(Path(areal.__file__).resolve().parents[1])
# The quickstart, made small: a step every 8 episodes, 3 steps.
SMALL = [*small(8), "train.max_steps=3"]


def quickstart(tmp: Path, *sets: str) -> RunConfig:
    sets = (f"model.path={tmp / 'model'}", f"logging.log_dir={tmp / 'logs'}", *sets)
    return load_run_config(ROOT / "configs" / "quickstart.yaml", [*SMALL, *sets])


def sbatch_lines(script: str) -> list[str]:
    return [
        line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH")
    ]


def test_the_script_of_two_trainer_nodes_and_one_inference_node(tmp_path: Path) -> None:
    config = quickstart(tmp_path, "async.train_workers=4", "train.parallelism.dp=4")
    options = parse_options(
        {"trainer_nodes": 2, "inference_nodes": 1, "partition": "gpu", "account": "rl",
         "gpus_per_node": 8, "time": "02:00:00", "sbatch_args": ["--qos=high"]}
    )  # fmt: skip
    out, resolved = tmp_path / "out", tmp_path / "out" / "run" / "resolved.yaml"
    script = sbatch_script(config, out, resolved, options)
    flags = sbatch_lines(script)
    assert flags == [
        "--job-name=areal", "--nodes=3", "--ntasks-per-node=1", "--exclusive", "--time=02:00:00",
        f"--output={tmp_path / 'logs' / 'slurm-%j.out'}", f"--chdir={Path.cwd()}",
        "--partition=gpu", "--account=rl", "--gpus-per-node=8", "--qos=high",
    ]  # fmt: skip
    lines = script.splitlines()
    assert 'TRAINER=("${HOSTS[@]:0:2}")' in lines and 'INFERENCE=("${HOSTS[@]:2}")' in lines
    assert 'export AREAL_SLURM_TRAINER_NODES="${TRAINER[*]}"' in lines
    assert 'export AREAL_SLURM_INFERENCE_NODES="${INFERENCE[*]}"' in lines
    (rdzv,) = [line for line in lines if line.startswith("export AREAL_TORCHRUN_ARGS=")]
    shell = f'FIRST_TRAINER_NODE=h0 SLURM_JOB_ID=7; {rdzv}; echo "$AREAL_TORCHRUN_ARGS"'
    value = subprocess.run(["bash", "-c", shell], capture_output=True, text=True).stdout
    assert shlex.split(value) == [  # what launch.py hands torchrun on each trainer node
        "--nnodes", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "h0:29500", "--rdzv-id", "7",
    ]  # fmt: skip
    step = shlex.split(lines[-1])
    assert step[:6] == [
        "exec",
        "srun",
        "--overlap",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
    ]
    assert "--kill-on-bad-exit=1" in step
    command = step[step.index("--") + 1 :]
    assert command == [
        sys.executable, "-m", "areal", "train", str(resolved), "--output-dir", str(out),
    ]  # fmt: skip
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    # One trainer node: no rendezvous (torchrun --standalone on the node, as locally).
    one = sbatch_script(config, out, resolved, parse_options({"cpus_per_task": 2}))
    assert "AREAL_TORCHRUN_ARGS" not in one and "--exclusive" not in sbatch_lines(one)
    assert "--cpus-per-task=2" in sbatch_lines(one) and "--nodes=2" in sbatch_lines(one)


def test_a_bad_option_names_its_key() -> None:
    with pytest.raises(ConfigError, match=r"^launcher\.options\.trainer_nodes: .*greater than"):
        parse_options({"trainer_nodes": 0})
    with pytest.raises(
        ConfigError, match=r"launcher\.options\.nodes: unknown option .*trainer_nodes"
    ):
        factory({"nodes": 2})
    with pytest.raises(ConfigError, match=r"launcher\.options\.sbatch_args: "):
        parse_options({"sbatch_args": "--qos=high"})
    with pytest.raises(ValueError):  # frozen: options are the run's, not changed behind it
        SlurmOptions().time = "1"  # type: ignore[misc]


def test_wrap_puts_engines_on_inference_nodes_and_the_rest_on_the_first_trainer_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AREAL_SLURM_TRAINER_NODES", "t0 t1")
    monkeypatch.setenv("AREAL_SLURM_INFERENCE_NODES", "i0 i1")
    launcher = SlurmLauncher(SlurmOptions())
    nodes = [launcher.node(Placement(f"engine{i}", "engine")) for i in range(3)]
    assert nodes == ["i0", "i1", "i0"]
    assert launcher.wrap(Placement("engine1", "engine", cpus=1.5, gpus=2), ["serve", "x"]) == [
        "srun", "--overlap", "--disable-status", "--nodes=1", "--ntasks=1", "--nodelist=i1",
        "--cpus-per-task=2", "--gpus=2", "--job-name=engine1", "--kill-on-bad-exit=1",
        "--", "serve", "x",
    ]  # fmt: skip
    assert "--nodelist=t0" in launcher.wrap(Placement("gateway", "gateway"), ["g"])
    assert launcher.describe(Placement("rollout0", "rollout")) == "slurm step on t0 (1 CPU(s))"
    monkeypatch.setenv("AREAL_SLURM_INFERENCE_NODES", "")  # engines share the trainer's node
    assert launcher.node(Placement("engine0", "engine")) == "t0"


def test_without_sbatch_submit_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch on it
    assert submit(quickstart(tmp_path), tmp_path / "out", tmp_path / "r.yaml") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "install Slurm" in err and "--launcher local" in err


def _job_env() -> dict[str, str]:
    """The submitting process's environment, with the areal under test importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([SRC, *filter(None, [env.get("PYTHONPATH")])])
    return env


@pytest.mark.serial  # the session's Slurm cluster
def test_wrapped_children_are_steps_of_the_allocation(slurm_cluster: Path, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    script = tmp_path / "steps.sbatch"
    body = node_lines(SlurmOptions(inference_nodes=0))
    helper = [sys.executable, str(Path(__file__).with_name("wrapped_steps.py")), str(report)]
    script.write_text(
        "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --exclusive\n"
        f"#SBATCH --output={tmp_path / 'job.out'}\n"
        + "\n".join(body)
        + "\n"
        + shlex.join(helper)
        + "\n"
    )
    started = time.monotonic()
    done = subprocess.run(
        ["sbatch", "--parsable", "--wait", str(script)],
        env=_job_env(), capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert done.returncode == 0, done.stderr + log
    job = done.stdout.strip().split(";")[0]
    out = json.loads(report.read_text())
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    assert f"--nodelist={host}" in out["wrapped"]
    # The python -c child ran as step 0 of this job, on the trainer's node.
    assert out["write_rc"] == 0 and out["written"].split()[0] == f"{job}.0"
    # SIGTERM to a child's srun ends its step and the task within seconds (srun SIGKILLs it).
    assert out["step_seen_s"] >= 0 and out["task_seen_s"] >= 0 and out["sleeper_rc"] != 0
    assert 0 <= out["sleep_gone_s"] < 10 and 0 <= out["sleeper_step_gone_s"] < 15
    # SIGINT reaches the task itself (--disable-status), which stops on its own terms.
    assert out["handler_set_s"] >= 0
    assert out["graceful_rc"] == 0 and out["graceful_signal"] == "2"
    assert time.monotonic() - started < 60


@pytest.mark.serial  # the session's Slurm cluster
def test_a_quickstart_run_trains_three_steps_inside_the_allocation(
    slurm_cluster: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    # launcher.name slurm: inside the job `areal train` runs the run and every child (engine,
    # gateway, rollout worker) is an `srun --overlap` step of the allocation. The servers listen
    # on the node's routed address (launcher.listen: node), as they must across hosts.
    options = "launcher.options={inference_nodes: 0, time: '00:05:00'}"
    config = quickstart(tmp_path, "launcher.name=slurm", options, "launcher.listen=node")
    out = tmp_path / "out"
    resolved = out / "run" / "resolved.yaml"  # what `areal train --launcher slurm` writes
    resolved.parent.mkdir(parents=True)
    resolved.write_text(config.to_yaml())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", _job_env()["PYTHONPATH"])
    started = time.monotonic()
    code = submit(config, out, resolved)
    took = time.monotonic() - started
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("slurm: job ")]
    log = Path(line.rpartition("its log: ")[2])
    assert log.parent == tmp_path / "logs" and log.is_file(), line
    assert code == 0, log.read_text()[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["stopped_by"] == "max_steps"
    train_log = (tmp_path / "logs" / "train.log").read_text().splitlines()
    assert [l.split()[1] for l in train_log if l.startswith("[train] ")] == [  # noqa: E741
        "step=1", "step=2", "step=3",
    ]  # fmt: skip
    job_log = log.read_text()
    assert "done: 3 steps" in job_log
    ip = node_address()
    for server in ("engine0", "gateway"):  # each step said its node's address through srun
        assert f"{server} runs on {ip}: http://{ip}:" in job_log, job_log[-3000:]
    assert (out / "run" / "areal.sbatch").is_file()
    assert took < 90, took


@pytest.mark.serial  # the session's Slurm cluster
def test_a_job_cancelled_before_it_starts_is_a_failure(
    slurm_cluster: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``sbatch --wait`` exits 0 for a pending job that is cancelled; submit must not."""
    config = quickstart(tmp_path)
    name = f"areal-held-{os.getpid()}"
    options = SlurmOptions(inference_nodes=0, job_name=name, sbatch_args=["--hold"])

    def queued() -> list[str]:
        return subprocess.run(
            ["squeue", "--noheader", f"--name={name}", "--format=%i"],
            capture_output=True, text=True,
        ).stdout.split()  # fmt: skip

    def cancel() -> None:
        subprocess.run(["scancel", *eventually(queued, 60, f"job {name} queued")], check=True)

    canceller = threading.Thread(target=cancel)
    canceller.start()
    code = submit_with(config, tmp_path / "out", tmp_path / "never-read.yaml", options)
    canceller.join()
    assert code == 1
    assert "ended CANCELLED" in capsys.readouterr().err
