"""A real one-node Slurm cluster for the session, brought up by ``tests/cluster/slurm_local.sh``
(the script ``make slurm`` runs): installed with apt when missing, started, stopped at the end
unless it was already up. Where it cannot be had, the tests that need it fail, naming the step
that failed (the script says which: install, munge, slurmctld, slurmd, the node's first job)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("slurm_local.sh")
STATE_DIR = Path(os.environ.get("AREAL_SLURM_DIR", "/tmp/areal-slurm"))


def _node_up() -> bool:
    """Whether sinfo (through our config) already shows the node ready."""
    if shutil.which("sinfo") is None or not (STATE_DIR / "slurm.conf").exists():
        return False
    env = {**os.environ, "SLURM_CONF": str(STATE_DIR / "slurm.conf")}
    done = subprocess.run(
        ["sinfo", "--noheader", "--format=%T"], env=env, capture_output=True, text=True, timeout=10
    )
    return done.returncode == 0 and done.stdout.strip() in {"idle", "mixed", "allocated"}


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Path]:
    """The cluster's slurm.conf; ``SLURM_CONF`` points at it for the session."""
    if shutil.which("slurmctld") is None and os.geteuid() != 0:
        pytest.fail(
            "Slurm is not installed and installing it (apt) needs root: run "
            f"`sudo bash {SCRIPT} start` (`make slurm`) once",
            pytrace=False,
        )
    was_up = _node_up()
    if not was_up:
        done = subprocess.run(
            ["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=600
        )
        if done.returncode:
            errors = [line for line in done.stderr.splitlines() if "error:" in line]
            why = (errors or done.stderr.strip().splitlines() or ["no output"])[-1]
            pytest.fail(
                f"the local Slurm cluster did not start ({SCRIPT} start): {why}", pytrace=False
            )
    conf = STATE_DIR / "slurm.conf"
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)
    try:
        yield conf
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        if not was_up:
            subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, timeout=120)
