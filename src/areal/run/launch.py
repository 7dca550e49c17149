"""``areal train`` with ``async.train_workers > 1``: start the trainer's ranks under ``torchrun``.

The command the user typed re-runs itself as ``python -m torch.distributed.run ... -m areal.run.train
--config RUN_DIR/resolved.yaml``: the config is written resolved (``--set`` overrides and
``${ENV}`` applied), so every rank reads the same run. On one node ``--standalone
--nproc-per-node N``; on several, the user's own torchrun flags (``--torchrun`` or
``AREAL_TORCHRUN_ARGS``: ``--nnodes``, ``--node-rank``, ``--rdzv-*``) replace ``--standalone``.

Dying: torchrun is started behind :func:`~areal.host.parent_death.guarded`, so it dies with this
process whatever kills it, and every rank watches its parent (torchrun) and dies with it, so a
SIGKILLed ``areal train`` leaves no rank, and no process of rank 0's, behind.

Stopping: torchrun runs in a session of its own, so a terminal's Ctrl-C reaches this process
only; it is passed on to torchrun as SIGINT (SIGTERM too), which hands it to every rank. Rank 0
stops gracefully (finish the step, checkpoint, tell the followers to stop); followers ignore it
and wait for rank 0's ``stop``. A rank that dies makes torchrun stop the others and exit non-zero.

torch-free at import: this runs in the process the user started, before any rank.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from areal.core.launcher import TORCHRUN_ENV
from areal.core.train_engine import dist_timeout, launched, rank
from areal.host.parent_death import guarded
from areal.host.process import wait_passing_on_stops

if TYPE_CHECKING:
    from areal.core.run_config import RunConfig

__all__ = [
    "TORCHRUN_ENV",
    "launch",
    "launched",
    "rank",
    "torchrun_command",
    "write_resolved",
]


def torchrun_command(
    workers: int, config_path: Path, output_dir: Path, *, resume: bool, extra: Sequence[str] = ()
) -> list[str]:
    """The torchrun command line for ``workers`` ranks in all (on one node unless ``extra`` says
    ``--nnodes``)."""
    extra = list(extra)
    flags = {arg.split("=", 1)[0].replace("_", "-") for arg in extra if arg.startswith("--")}
    launch = [] if flags & {"--nnodes", "--rdzv-endpoint", "--standalone"} else ["--standalone"]
    if "--nproc-per-node" not in flags:
        nodes = _nnodes(extra)
        if workers % nodes:
            raise ValueError(
                f"async.train_workers: {workers} ranks do not split evenly over --nnodes {nodes}; "
                "use a multiple of the node count or pass --nproc-per-node"
            )
        launch += ["--nproc-per-node", str(workers // nodes)]
    timeout = str(int(dist_timeout()))
    command = [sys.executable, "-m", "torch.distributed.run", *launch, *extra]
    command += ["--shutdown-timeout", timeout, "-m", "areal.run.train"]
    command += ["--config", str(config_path), "--output-dir", str(output_dir)]
    return command + (["--resume"] if resume else [])


def _nnodes(args: Sequence[str]) -> int:
    """``--nnodes M`` (or ``MIN:MAX``: the fixed count is MAX) from torchrun flags; 1 if absent."""
    for i, arg in enumerate(args):
        key, _, value = arg.partition("=")
        if key.replace("_", "-") == "--nnodes":
            value = value or (args[i + 1] if i + 1 < len(args) else "1")
            return int(value.split(":")[-1])
    return 1


def write_resolved(config: RunConfig, output_dir: Path) -> Path:
    """The config with ``--set`` and ``${ENV}`` applied, for processes that read the same run."""
    run_dir = output_dir / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = run_dir / "resolved.yaml"
    resolved.write_text(config.to_yaml())
    resolved.chmod(0o600)  # ${ENV} values are in it
    return resolved


def launch(
    config: RunConfig, output_dir: Path, *, resume: bool = False, extra: Sequence[str] = ()
) -> int:
    """Write the resolved config, run torchrun, return its exit code (0 after a graceful stop)."""
    extra = [*shlex.split(os.environ.get(TORCHRUN_ENV, "")), *extra]
    resolved = write_resolved(config, output_dir)
    try:
        command = torchrun_command(
            config.async_.train_workers, resolved, output_dir, resume=resume, extra=extra
        )
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    started = time.time()
    # torchrun dies with this process, by any signal; its ranks watch torchrun (train.run).
    proc = subprocess.Popen(guarded(command), start_new_session=True)
    code, signalled = wait_passing_on_stops(proc)  # rank 0 stops gracefully on SIGINT
    if code and signalled and _stopped_by_signal(output_dir / "summary.json", started):
        return 0  # torchrun exits non-zero after forwarding a signal; rank 0 finished cleanly
    if code and code not in (2, 130):
        print(
            f"error: the trainer ranks failed (torchrun exit code {code}); torchrun's report "
            "above names the rank",
            file=sys.stderr,
        )
    return code


def _stopped_by_signal(summary: Path, since: float) -> bool:
    """Whether rank 0 wrote this run's summary after a graceful stop."""
    try:
        if summary.stat().st_mtime < since:
            return False
        return bool(json.loads(summary.read_text()).get("stopped_by") == "signal")
    except (OSError, ValueError):
        return False
