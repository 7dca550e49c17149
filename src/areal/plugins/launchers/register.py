"""The Slurm launcher, registered through ``areal_register_launchers`` (the hook and
``LauncherSpec`` come with ``areal.core.launcher``; until then nothing calls this)."""

from __future__ import annotations

from typing import Any

from areal.core.hookspecs import hookimpl


@hookimpl
def areal_register_launchers(register: Any) -> None:
    """``launcher.name: slurm``: children as srun steps of one allocation; ``submit`` outside."""
    from areal.core.launcher import LauncherSpec

    register(
        LauncherSpec(
            name="slurm",
            factory="areal.plugins.launchers.slurm:factory",
            submit="areal.plugins.launchers.slurm:submit",
            description="one sbatch allocation; each process an srun step in it",
        )
    )
