"""The Ray launcher: every process of a run a Ray actor, placed by the resources its role asks.

``areal train CONFIG --launcher ray`` on a machine of a running Ray cluster (``ray start``;
``RAY_ADDRESS`` or ``launcher.options.address`` names another) hands the trainer to Ray as an
actor (:func:`submit`); the trainer's rank 0 then starts the engines, the gateway and the rollout
workers as actors too (:class:`RayLauncher`), each through a local stand-in process
(:mod:`areal.plugins.launchers.ray_exec`) that the supervisor watches like any child. Roles go
where their resources are: start a node with ``ray start --resources '{"inference": 8}'`` and
set ``launcher.options.resources.engine: {inference: 1}``, and the engines land there.

With ``launcher.listen: loopback`` (the default) every process reaches the others at 127.0.0.1,
so the nodes must share one host; ``node`` has each server listen on the address Ray gives its
node (the stand-in's actor passes it on, :mod:`areal.host.on_node`), so they may be anywhere.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from areal.core.launcher import LAUNCHED_BY_ENV, TORCHRUN_ENV, Placement, Role
from areal.host.parent_death import guarded
from areal.host.process import wait_passing_on_stops
from areal.plugins.launchers.ray_exec import NAMESPACE_ENV

if TYPE_CHECKING:
    from areal.core.run_config import RunConfig

INSTALL_HINT = "pip install 'areal[ray]' (make setup installs it into .venv)"


class RayOptions(BaseModel):
    """``launcher.options`` for ``launcher.name: ray``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str | None = None  # default: RAY_ADDRESS, else the cluster this machine is in
    resources: dict[Role, dict[str, float]] = Field(default_factory=dict)  # custom, per role
    cpus: dict[Role, float] = Field(default_factory=dict)  # logical CPUs per role (default 1)
    stop_timeout_s: float = Field(default=30.0, gt=0)
    # Roles whose actors Ray spreads over the nodes that fit (its SPREAD strategy) instead of
    # packing them onto the fewest: engines on different nodes share no node's CPUs or network.
    spread: tuple[Role, ...] = ("engine",)
    # A trainer over several nodes: one actor per node in a placement group (STRICT_SPREAD),
    # each running torchrun with the node's share of async.train_workers, meeting at the first.
    trainer_nodes: int = Field(default=1, ge=1)
    rendezvous_port: int = Field(default=29500, ge=1, le=65535)
    placement_timeout_s: float = Field(default=300.0, gt=0)


def ray_options(options: dict[str, Any]) -> RayOptions:
    try:
        return RayOptions(**options)
    except ValidationError as err:
        problem = err.errors()[0]
        key = ".".join(str(part) for part in problem["loc"])
        raise ValueError(f"launcher.options.{key}: {problem['msg']}") from None


class RayLauncher:
    """Wraps each child's command in a :mod:`~areal.plugins.launchers.ray_exec` stand-in."""

    name = "ray"
    stop_signal: signal.Signals = signal.SIGTERM  # the stand-in passes it on to the command

    def __init__(self, options: dict[str, Any], config: RunConfig | None = None) -> None:
        self.options = ray_options(options)

    def actor_args(self, placement: Placement) -> list[str]:
        opts = self.options
        cpus = opts.cpus.get(placement.role, placement.cpus)
        args = ["--name", placement.name, "--num-cpus", str(cpus)]
        args += ["--num-gpus", str(placement.gpus), "--stop-timeout", str(opts.stop_timeout_s)]
        if opts.address:
            args += ["--address", opts.address]
        if placement.role in opts.spread:
            args.append("--spread")
        resources = opts.resources.get(placement.role)
        return args + (["--resources", json.dumps(resources)] if resources else [])

    def wrap(self, placement: Placement, command: Sequence[str]) -> list[str]:
        stand_in = [sys.executable, "-m", "areal.plugins.launchers.ray_exec"]
        return [*stand_in, *self.actor_args(placement), "--", *command]

    def describe(self, placement: Placement) -> str:
        opts = self.options
        nodes = opts.trainer_nodes if placement.role == "trainer" else 1
        needs = [f"{opts.cpus.get(placement.role, placement.cpus):g} CPU"]
        if placement.gpus:
            needs.append(f"{placement.gpus // nodes} GPU")
        needs += [f"{v:g} {k}" for k, v in opts.resources.get(placement.role, {}).items()]
        if nodes > 1:
            return (
                f"{nodes} Ray actors 'trainer0'..'trainer{nodes - 1}', one per node (a placement "
                f"group, STRICT_SPREAD), each on a node with {', '.join(needs)}; torchrun meets "
                f"on trainer0's node, port {opts.rendezvous_port}"
            )
        return f"Ray actor {placement.name!r} on a node with {', '.join(needs)}"

    def node_placements(self, trainer: Placement) -> list[Placement]:
        """The trainer's actors: itself on one node, else one per node with its share of GPUs."""
        nodes = self.options.trainer_nodes
        if nodes == 1:
            return [trainer]
        share = trainer.gpus // nodes  # train_workers splits evenly (trainer_nodes_problem)
        return [Placement(f"trainer{i}", "trainer", trainer.cpus, share) for i in range(nodes)]


def why_not_runnable() -> str | None:
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        return f"the ray launcher needs the ray package: {INSTALL_HINT}"
    return None


def submit(
    config: RunConfig, output_dir: Path, resolved_config: Path, resume: bool, trainer: Placement
) -> int:
    """Run the trainer as a Ray actor, or one per node (its rank 0 places the rest), and follow
    it to its end: its log lines are printed here, Ctrl-C stops it gracefully, its exit code is
    returned."""
    problem = why_not_runnable()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    launcher = RayLauncher(dict(config.launcher.options), config)
    problem = trainer_nodes_problem(config, launcher.options)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    command = [sys.executable, "-m", "areal", "train", str(resolved_config)]
    command += ["--output-dir", str(output_dir)] + (["--resume"] if resume else [])
    namespace = f"areal-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, LAUNCHED_BY_ENV: "ray", NAMESPACE_ENV: namespace}
    print(f"[ray] the trainer goes to Ray (namespace {namespace})", file=sys.stderr, flush=True)
    if launcher.options.trainer_nodes == 1:
        proc = subprocess.Popen(guarded(launcher.wrap(trainer, command)), env=env)
        return wait_passing_on_stops(proc)[0]
    return _submit_trainer_nodes(launcher, trainer, command, env, namespace)


def trainer_nodes_problem(config: RunConfig, options: RayOptions) -> str | None:
    """Why a trainer over ``trainer_nodes`` nodes cannot run as configured, or None."""
    nodes, workers = options.trainer_nodes, config.async_.train_workers
    if nodes == 1:
        return None
    if workers % nodes:
        return (
            f"launcher.options.trainer_nodes: {nodes} nodes cannot split async.train_workers "
            f"{workers} evenly; use a divisor of {workers}"
        )
    return None  # launcher.listen: node, which a trainer on several nodes needs, is the config's


def _submit_trainer_nodes(
    launcher: RayLauncher, trainer: Placement, command: list[str], env: dict[str, str],
    namespace: str,
) -> int:  # fmt: skip
    """A placement group of one bundle per node, a stand-in per bundle, torchrun on each with a
    c10d rendezvous on the first bundle's node (which of them is rank 0 is torchrun's choice)."""
    import ray
    from ray.util.placement_group import (
        placement_group,
        placement_group_table,
        remove_placement_group,
    )

    opts = launcher.options
    nodes = launcher.node_placements(trainer)
    bundle: dict[str, float] = {"CPU": opts.cpus.get("trainer", trainer.cpus)}
    if nodes[0].gpus:
        bundle["GPU"] = nodes[0].gpus
    bundle.update(opts.resources.get("trainer", {}))
    address = opts.address or os.environ.get("RAY_ADDRESS") or "auto"
    ray.init(address=address, namespace=namespace, log_to_driver=False)
    name = f"{namespace}-trainer"
    group = placement_group([bundle] * len(nodes), strategy="STRICT_SPREAD", name=name)
    try:
        ready, _ = ray.wait([group.ready()], timeout=opts.placement_timeout_s)
        if not ready:
            print(
                f"error: launcher.options.trainer_nodes: Ray found no {len(nodes)} different "
                f"nodes with {bundle} free each within {opts.placement_timeout_s:g} s "
                "(launcher.options.placement_timeout_s); add nodes or lower trainer_nodes",
                file=sys.stderr,
            )
            return 2
        first = placement_group_table(group)["bundles_to_node_id"][0]
        host = next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == first)
        rendezvous = f"--nnodes {len(nodes)} --rdzv-backend c10d --rdzv-id {namespace} "
        rendezvous += f"--rdzv-endpoint {host}:{opts.rendezvous_port}"
        print(f"[ray] {len(nodes)} trainer nodes meet at {host}:{opts.rendezvous_port}",
              file=sys.stderr, flush=True)  # fmt: skip
        procs = []
        for index, placement in enumerate(nodes):
            wrapped = launcher.wrap(placement, command)
            at = wrapped.index("--")
            wrapped[at:at] = ["--placement-group", name, "--bundle-index", str(index)]
            # The first bundle's torchrun hosts the rendezvous store: said, not guessed from
            # host names (which miss an address that is not the host name's).
            hosts = f" --rdzv-conf is_host={int(index == 0)}"
            node_env = {**env, TORCHRUN_ENV: rendezvous + hosts}
            procs.append(subprocess.Popen(guarded(wrapped), env=node_env))
        return wait_passing_on_stops(*procs)[0]
    finally:
        remove_placement_group(group)
        ray.shutdown()
