"""Built-in launchers: ``local`` (the default), ``ray``, ``slurm``."""

from __future__ import annotations

from areal.core.hookspecs import Register, hookimpl
from areal.core.launcher import LauncherSpec


@hookimpl
def areal_register_launchers(register: Register) -> None:
    register(
        "local",
        LauncherSpec(
            name="local",
            factory="areal.core.launcher:LocalLauncher",
            description="every process on this machine",
        ),
    )
    register(
        "ray",
        LauncherSpec(
            name="ray",
            factory="areal.plugins.launchers.ray_launcher:RayLauncher",
            submit="areal.plugins.launchers.ray_launcher:submit",
            description="each process a Ray actor, placed by its resources (pip install "
            "'areal[ray]')",
        ),
    )
    register(
        "slurm",
        LauncherSpec(
            name="slurm",
            factory="areal.plugins.launchers.slurm:factory",
            submit="areal.plugins.launchers.slurm:submit",
            description="one sbatch allocation; each process an srun step in it",
        ),
    )
