"""Launchers: where a run's processes run. One plan, several ways to place it.

A run is the same set of processes wherever it runs: ``inference.engines`` engines, a gateway,
``async.rollout_workers`` rollout workers and the trainer. A launcher (``launcher.name``,
registered with ``areal_register_launchers``) decides where each goes, in two places:

- ``submit``: ``areal train`` outside the launcher's cluster hands it the trainer (whose rank 0
  runs the rest); ``local`` has no submit: the trainer is the process the user started.
- ``wrap``: inside, the supervisor turns each child's command line into one that runs it where
  its :class:`Placement` says (``srun ... -- CMD`` on Slurm; a Ray actor on Ray), and runs that
  as a local process. The supervisor's rules (restart a child that dies, give up after
  ``max_restarts`` naming it, stop them all with the run) hold unchanged for every launcher:
  the local process ends when the placed one does, and takes it along when it is stopped.

torch-free and Ray-free: a launcher's module is imported only when a run picks it.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from areal.core.tasks import load_object

if TYPE_CHECKING:
    from areal.core.run_config import RunConfig

Role = Literal["engine", "gateway", "rollout", "trainer"]

# Set in the trainer's environment by a launcher's ``submit``: the run is inside that launcher's
# cluster, so ``areal train`` runs it instead of submitting it again.
LAUNCHED_BY_ENV = "AREAL_LAUNCHED_BY"

# torchrun flags for a trainer over several nodes (``--nnodes``, ``--node-rank``, ``--rdzv-*``):
# a launcher that spreads the trainer sets it per node, and ``areal train`` appends it.
TORCHRUN_ENV = "AREAL_TORCHRUN_ARGS"


@dataclass(frozen=True)
class Placement:
    """What one process of the run needs, for a launcher to place it."""

    name: str  # engine0, gateway, rollout0, trainer
    role: Role
    cpus: float = 1.0
    gpus: int = 0


class Launcher(Protocol):
    name: str
    # What the supervisor sends a wrapped child to stop it gracefully (optional: SIGTERM).
    stop_signal: signal.Signals

    def wrap(self, placement: Placement, command: Sequence[str]) -> list[str]:
        """The command line that runs ``command`` where ``placement`` goes."""
        ...

    def describe(self, placement: Placement) -> str:
        """Where ``placement`` would run: one line of ``areal train --dry-run``."""
        ...


@dataclass(frozen=True)
class LauncherSpec:
    """A launcher as a plugin registers it: ``factory(options, config) -> Launcher``;
    ``submit(config, output_dir, resolved_config, resume, trainer) -> exit code`` runs the trainer in the
    launcher's cluster (``trainer``: what the trainer needs; empty: the trainer runs where
    ``areal train`` was typed)."""

    name: str
    factory: str
    description: str = ""
    submit: str = ""

    def build(self, options: dict[str, Any], config: RunConfig) -> Launcher:
        launcher: Launcher = load_object(self.factory)(options, config)
        return launcher

    def run_submit(
        self,
        config: RunConfig,
        output_dir: Path,
        resolved_config: Path,
        resume: bool,
        trainer: Placement,
    ) -> int:
        code: int = load_object(self.submit)(config, output_dir, resolved_config, resume, trainer)
        return code


class LocalLauncher:
    """Every process on this machine, as the command says (the default)."""

    name = "local"
    stop_signal: signal.Signals = signal.SIGTERM

    def __init__(self, options: dict[str, Any] | None = None, config: Any = None) -> None:
        if options:
            raise ValueError(
                f"launcher.options: the local launcher has no options (got {sorted(options)})"
            )

    def wrap(self, placement: Placement, command: Sequence[str]) -> list[str]:
        return list(command)

    def describe(self, placement: Placement) -> str:
        return "this machine"


def launcher_for(config: RunConfig) -> Launcher:
    """The run's launcher, built from ``launcher.name`` and ``launcher.options``."""
    from areal.core.plugins import registry

    spec: LauncherSpec = registry("launchers").get(config.launcher.name, key="launcher.name")
    return spec.build(dict(config.launcher.options), config)
