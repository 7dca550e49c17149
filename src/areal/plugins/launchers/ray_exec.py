"""Run one command as a Ray actor, from a local stand-in process: ``python -m
areal.plugins.launchers.ray_exec --name engine0 --num-cpus 1 -- CMD ...``.

The supervisor runs this stand-in where it would run the command, so its rules hold for actors:
the stand-in prints the actor's output (its log), exits with the command's exit code (the
supervisor restarts it, or gives up naming it), passes SIGTERM and SIGINT on to the command, and
ends with a clear line when the actor or its node dies. The actor is owned by the stand-in: Ray
kills it when the stand-in exits, however it exits, and the command dies with the actor (its
parent-death guard). ``ray list actors`` shows each actor by the run's process name.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

from areal.host.on_node import NODE_ADDRESS_ENV
from areal.host.parent_death import guarded

POLL_S = 0.2
NAMESPACE_ENV = "AREAL_RAY_NAMESPACE"  # one Ray namespace per run: names are unique in it


class ProcessActor:
    """One command, on whichever node Ray placed this actor; its output kept for ``poll``."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.output: list[bytes] = []
        self.lock = threading.Lock()

    def start(self, command: list[str], env: dict[str, str], cwd: str) -> dict[str, Any]:
        import ray

        env = dict(env)
        if "CUDA_VISIBLE_DEVICES" in os.environ:  # the GPUs Ray gave this actor
            env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
        # The node's address as the cluster knows it: where the command's servers listen.
        ip = ray.util.get_node_ip_address()
        env[NODE_ADDRESS_ENV] = ip
        self.proc = subprocess.Popen(
            guarded(command, watch=True),  # dies with this actor, from whichever thread
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: signals go to the command through it
        )
        threading.Thread(target=self._read, daemon=True).start()
        context = ray.get_runtime_context()
        return {
            "pid": self.proc.pid,
            "node": context.get_node_id(),
            "ip": ip,
        }

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in iter(self.proc.stdout.readline, b""):
            with self.lock:
                self.output.append(line)

    def poll(self) -> tuple[bytes, int | None]:
        """The output since the last poll, and the exit code once the command has ended."""
        assert self.proc is not None
        code = self.proc.poll()
        if code is not None:
            time.sleep(0.05)  # the reader's last lines
        with self.lock:
            out, self.output = b"".join(self.output), []
        return out, code

    def send(self, signum: int) -> None:
        """To the command's group (the guard's watcher waits; the command decides)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signum)

    def kill(self) -> None:
        self.send(signal.SIGKILL)


def actor_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {
        "name": args.name,
        "namespace": os.environ.get(NAMESPACE_ENV) or None,
        "num_cpus": args.num_cpus,
        "num_gpus": args.num_gpus,
        "max_restarts": 0,  # the supervisor restarts, by its own rules
    }
    resources = json.loads(args.resources or "{}")
    if resources:
        options["resources"] = resources
    if args.spread:  # one of several of a role (engines): over the nodes, not packed
        options["scheduling_strategy"] = "SPREAD"
    if args.placement_group:  # a trainer node: its bundle of the run's trainer group
        from ray.util import get_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            get_placement_group(args.placement_group),
            placement_group_bundle_index=args.bundle_index,
        )
    return options


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m areal.plugins.launchers.ray_exec")
    parser.add_argument("--address", default=None, help="Ray cluster (default: RAY_ADDRESS/auto)")
    parser.add_argument("--name", required=True)
    parser.add_argument("--num-cpus", type=float, default=1.0)
    parser.add_argument("--num-gpus", type=float, default=0.0)
    parser.add_argument("--resources", default="", help="custom resources as JSON")
    parser.add_argument("--stop-timeout", type=float, default=30.0)
    parser.add_argument("--spread", action="store_true", help="Ray's SPREAD strategy")
    parser.add_argument("--placement-group", default="", help="a named group to run in")
    parser.add_argument("--bundle-index", type=int, default=0, help="its bundle to run on")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")

    import ray
    from ray.exceptions import RayActorError

    ray.init(address=args.address or os.environ.get("RAY_ADDRESS") or "auto", log_to_driver=False,
             namespace=os.environ.get(NAMESPACE_ENV) or None)  # fmt: skip
    signals: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        signals.append(signum)

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, on_signal)
    # By its module's name, not __main__'s: the workers import it rather than unpickle a copy.
    from areal.plugins.launchers.ray_exec import ProcessActor as Actor

    # Ray's stubs type an actor's methods as plain callables; the handle is untyped here.
    actor: Any = ray.remote(Actor).options(**actor_options(args)).remote()
    out = sys.stdout.buffer
    try:
        where = ray.get(actor.start.remote(command, dict(os.environ), os.getcwd()))
        print(f"[ray] {args.name}: pid {where['pid']} on node {where['ip']} ({where['node'][:12]})",
              flush=True)  # fmt: skip
        sent: float | None = None
        while True:
            chunk, code = ray.get(actor.poll.remote())
            out.write(chunk)
            out.flush()
            if code is not None:
                return int(code)
            if signals and sent is None:
                ray.get(actor.send.remote(signals[-1]))
                sent = time.monotonic()
            elif sent is not None and time.monotonic() - sent > args.stop_timeout:
                ray.get(actor.kill.remote())
            time.sleep(POLL_S)
    except RayActorError as err:
        print(f"[ray] {args.name}: its actor died ({err.__class__.__name__}: the node or the "
              "actor's process went away)", flush=True)  # fmt: skip
        return 1
    finally:
        ray.kill(actor)


if __name__ == "__main__":
    sys.exit(main())
