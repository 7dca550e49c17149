"""The Slurm launcher: one allocation holds the whole run; each process is a step in it.

``areal train CONFIG --launcher slurm`` outside an allocation calls :func:`submit`: it writes an
sbatch script (:func:`sbatch_script`) and follows the job with ``sbatch --wait``. The script
splits the allocation's hosts (the first ``trainer_nodes`` for the trainer, the rest for the
engines), exports them, and starts ``areal train`` on the trainer node(s) as one step. Inside,
the supervisor wraps each child's command with :meth:`SlurmLauncher.wrap` (``srun --overlap``),
so a child is a local ``srun`` process: the supervisor's restart and fail-fast rules hold, and
stopping the ``srun`` stops the step. torch-free: this runs in the command the user typed.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from areal.core.config import ConfigError, key_path
from areal.core.launcher import LAUNCHED_BY_ENV, TORCHRUN_ENV, Placement

if TYPE_CHECKING:
    from areal.core.run_config import RunConfig

__all__ = [
    "INFERENCE_NODES_ENV",
    "TRAINER_NODES_ENV",
    "Placement",
    "SlurmLauncher",
    "SlurmOptions",
    "factory",
    "node_lines",
    "parse_options",
    "sbatch_script",
    "submit",
    "submit_with",
]

TRAINER_NODES_ENV = "AREAL_SLURM_TRAINER_NODES"
INFERENCE_NODES_ENV = "AREAL_SLURM_INFERENCE_NODES"
RDZV_PORT = 29500


class SlurmOptions(BaseModel):
    """``launcher.options`` for ``launcher.name: slurm``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    partition: str | None = Field(default=None, description="sbatch --partition.")
    account: str | None = Field(default=None, description="sbatch --account.")
    time: str = Field(default="01:00:00", min_length=1, description="sbatch --time.")
    inference_nodes: int = Field(
        default=1, ge=0, description="Nodes for the engines; 0: they share the trainer's."
    )
    trainer_nodes: int = Field(default=1, ge=1, description="Nodes for the trainer's ranks.")
    cpus_per_task: int | None = Field(
        default=None, ge=1, description="CPUs per node for the job; unset: whole nodes."
    )
    gpus_per_node: int = Field(default=0, ge=0, description="sbatch --gpus-per-node.")
    sbatch_args: list[str] = Field(default_factory=list, description="More #SBATCH flags.")
    job_name: str = Field(default="areal", min_length=1, description="sbatch --job-name.")


def parse_options(options: Mapping[str, Any] | None) -> SlurmOptions:
    """Validated options; a bad one is a ConfigError naming ``launcher.options.<key>``."""
    try:
        return SlurmOptions.model_validate(dict(options or {}))
    except ValidationError as err:
        lines = [
            f"launcher.options.{key_path(e['loc'])}: "
            + (
                "unknown option (the slurm launcher's: "
                + ", ".join(SlurmOptions.model_fields)
                + ")"
                if e["type"] == "extra_forbidden"
                else f"{e['msg']} (got {e['input']!r})"
            )
            for e in err.errors()
        ]
        raise ConfigError("; ".join(lines)) from None


def options_of(config: RunConfig) -> SlurmOptions:
    """The run config's ``launcher.options`` (defaults where the config has no launcher yet)."""
    launcher = getattr(config, "launcher", None)
    return parse_options(getattr(launcher, "options", None))


def log_path(config: RunConfig, output_dir: Path) -> Path:
    """The batch job's log (``%j``: the job id), in the run's log dir."""
    return config.logging.directory(output_dir).resolve() / "slurm-%j.out"


def sbatch_script(
    config: RunConfig,
    output_dir: Path,
    resolved_config: Path,
    options: SlurmOptions,
    *,
    resume: bool = False,
) -> str:
    """One allocation of ``trainer_nodes + inference_nodes`` nodes running ``areal train``."""
    q = shlex.quote
    trainers, nodes = options.trainer_nodes, options.trainer_nodes + options.inference_nodes
    flags = [
        f"--job-name={options.job_name}",
        f"--nodes={max(1, nodes)}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={options.cpus_per_task}" if options.cpus_per_task else "--exclusive",
        f"--time={options.time}",
        f"--output={log_path(config, output_dir)}",
        f"--chdir={Path.cwd()}",
    ]
    flags += [f"--partition={options.partition}"] if options.partition else []
    flags += [f"--account={options.account}"] if options.account else []
    flags += [f"--gpus-per-node={options.gpus_per_node}"] if options.gpus_per_node else []
    flags += options.sbatch_args
    train = [sys.executable, "-m", "areal", "train", str(resolved_config.resolve())]
    train += ["--output-dir", str(output_dir.resolve())] + (["--resume"] if resume else [])
    lines = [
        "#!/bin/bash",
        "# Written by areal's Slurm launcher (areal.plugins.launchers.slurm); submitted by",
        "# `areal train --launcher slurm`. The first trainer_nodes hosts run the trainer, the",
        "# rest the engines; with fewer hosts, the engines share the first trainer node.",
        *(f"#SBATCH {q(flag)}" for flag in flags),
        *node_lines(options),
        f"export {LAUNCHED_BY_ENV}=slurm  # inside: areal train runs the run, wrapping its children",
    ]
    if trainers > 1:
        rdzv = f"--nnodes {trainers} --rdzv-backend c10d"
        rdzv += f" --rdzv-endpoint $FIRST_TRAINER_NODE:{RDZV_PORT} --rdzv-id $SLURM_JOB_ID"
        lines.append(f'export {TORCHRUN_ENV}="{rdzv}"')
    step = ["srun", "--overlap", f"--nodes={trainers}", f"--ntasks={trainers}"]
    step += ["--ntasks-per-node=1", '--nodelist="$(IFS=,; echo "${TRAINER[*]}")"']
    step += ['--cpus-per-task="${SLURM_CPUS_ON_NODE:-1}"', "--kill-on-bad-exit=1"]
    step += ["--job-name=trainer", "--", *(q(arg) for arg in train)]
    lines.append("exec " + " ".join(step))
    return "\n".join(lines) + "\n"


def node_lines(options: SlurmOptions) -> list[str]:
    """Bash that splits the allocation's hosts into ``TRAINER`` and ``INFERENCE`` and exports
    them for :meth:`SlurmLauncher.wrap` (which runs in the supervisor, inside the job)."""
    trainers = options.trainer_nodes
    return [
        "set -euo pipefail",
        'mapfile -t HOSTS < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        f'TRAINER=("${{HOSTS[@]:0:{trainers}}}")',
        f'INFERENCE=("${{HOSTS[@]:{trainers}}}")',
        f"if (( ${{#TRAINER[@]}} < {trainers} )); then",
        f'  echo "areal: {trainers} trainer node(s) asked, the job has ${{#HOSTS[@]}}" >&2; exit 2',
        "fi",
        f'export {TRAINER_NODES_ENV}="${{TRAINER[*]}}"',
        f'export {INFERENCE_NODES_ENV}="${{INFERENCE[*]}}"',
        'FIRST_TRAINER_NODE="${TRAINER[0]}"',
    ]


def submit(
    config: RunConfig,
    output_dir: Path,
    resolved_config: Path,
    resume: bool = False,
    trainer: Placement | None = None,
) -> int:
    """``areal train --launcher slurm`` outside an allocation: submit, follow, its exit code."""
    try:
        options = options_of(config)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return submit_with(config, output_dir, resolved_config, options, resume=resume)


def submit_with(
    config: RunConfig,
    output_dir: Path,
    resolved_config: Path,
    options: SlurmOptions,
    *,
    resume: bool = False,
) -> int:
    """Write ``<output_dir>/run/areal.sbatch``, ``sbatch --parsable --wait`` it, return its code
    (the job's own: sbatch --wait exits with it)."""
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        print(
            "error: sbatch not found: install Slurm (or run on a login node) or use "
            "--launcher local",
            file=sys.stderr,
        )
        return 2
    script = output_dir / "run" / "areal.sbatch"
    script.parent.mkdir(parents=True, exist_ok=True)
    log_path(config, output_dir).parent.mkdir(parents=True, exist_ok=True)
    script.write_text(sbatch_script(config, output_dir, resolved_config, options, resume=resume))
    proc = subprocess.Popen(
        [sbatch, "--parsable", "--wait", str(script)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    job = proc.stdout.readline().strip().split(";")[0]  # "ID" or "ID;CLUSTER"
    if job:
        log = str(log_path(config, output_dir)).replace("%j", job)
        print(f"slurm: job {job} submitted ({script}); its log: {log}", file=sys.stderr)
    try:
        proc.stdout.read()
        code = proc.wait()
    except KeyboardInterrupt:  # the job must not outlive the command that follows it
        if job:
            subprocess.run(["scancel", job], check=False)
        proc.wait()
        return 130
    state = job_state(job) if job and code == 0 else None
    if state not in (None, "COMPLETED"):  # sbatch --wait exits 0 for a job cancelled unstarted
        print(f"error: slurm job {job} ended {state}", file=sys.stderr)
        return 1
    return code


def job_state(job: str) -> str | None:
    """``JobState`` of a finished job while slurmctld still holds it (MinJobAge); else None."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return None
    done = subprocess.run(
        [scontrol, "--oneliner", "show", "job", job], capture_output=True, text=True, check=False
    )
    found = re.search(r"\bJobState=(\S+)", done.stdout)
    return found.group(1) if done.returncode == 0 and found else None


class SlurmLauncher:
    """Each child is an ``srun`` step of the run's allocation, on the node its role calls for."""

    name = "slurm"
    # srun turns a SIGTERM into a SIGKILL of the step; a SIGINT reaches the task
    # (--disable-status), which stops on its own terms.
    stop_signal: signal.Signals = signal.SIGINT

    def __init__(self, options: SlurmOptions, config: RunConfig | None = None) -> None:
        self.options = options
        self.config = config

    def script(self, output_dir: Path) -> str:
        """The sbatch script ``submit`` would write for this run (``--dry-run`` prints it)."""
        if self.config is None:
            raise ValueError("the Slurm launcher needs the run's config to write its script")
        resolved = output_dir / "run" / "resolved.yaml"
        return sbatch_script(self.config, output_dir, resolved, self.options)

    def node(self, placement: Placement, env: Mapping[str, str] | None = None) -> str | None:
        """Engines round-robin over the inference nodes (by the index in their name); the rest
        on the first trainer node; ``None`` outside the sbatch script (srun picks)."""
        env = os.environ if env is None else env
        trainers = env.get(TRAINER_NODES_ENV, "").split()
        inference = env.get(INFERENCE_NODES_ENV, "").split()
        if placement.role == "engine" and inference:
            index = re.search(r"(\d+)$", placement.name)
            return inference[int(index.group(1)) % len(inference) if index else 0]
        return trainers[0] if trainers else None

    def cpus(self, placement: Placement) -> int:
        return max(1, math.ceil(placement.cpus))

    def wrap(self, placement: Placement, command: Sequence[str]) -> list[str]:
        """``srun --overlap ... -- command``: a step sharing the allocation with the trainer's."""
        node = self.node(placement)
        # --disable-status: a SIGINT reaches the task (a graceful stop); srun answers SIGTERM by
        # SIGKILLing the step, so a supervisor that wants a graceful stop sends SIGINT.
        args = ["srun", "--overlap", "--disable-status", "--nodes=1", "--ntasks=1"]
        args += [f"--nodelist={node}"] if node else []
        args += [f"--cpus-per-task={self.cpus(placement)}"]
        args += [f"--gpus={placement.gpus}"] if placement.gpus else []
        args += [f"--job-name={placement.name}", "--kill-on-bad-exit=1", "--", *command]
        return args

    def describe(self, placement: Placement) -> str:
        where = self.node(placement)
        if where is None:
            where = "an inference node" if placement.role == "engine" else "the first trainer node"
        gpus = f", {placement.gpus} GPU(s)" if placement.gpus else ""
        return f"slurm step on {where} ({self.cpus(placement)} CPU(s){gpus})"


def factory(options: Mapping[str, Any], config: RunConfig | None = None) -> SlurmLauncher:
    """``launcher: {name: slurm, options: ...}`` → the launcher (options validated)."""
    return SlurmLauncher(parse_options(options), config)
