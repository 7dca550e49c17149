"""Run a command on a node with this node's address in it: ``python on_node.py -- CMD ...``.

A run's servers (its engines and gateway) on a launcher that spreads them over machines must
listen where the others can reach them, and the others must learn that address. Their command
lines carry :data:`NODE_HOST` where the address goes (``--host @node-address@``); a launcher
runs this shim on the node that got the process, and the shim

1. finds the node's address (:func:`node_address`): ``$AREAL_NODE_ADDRESS`` when the launcher
   knows it (a Ray actor sets Ray's own address of its node), else the address of the interface
   that routes off this machine, the one other machines reach it at;
2. prints :data:`ANNOUNCE` and the address as its first line, which the supervisor reads from the
   child's log to learn the child's URL (stdout travels back through ``srun`` or the Ray stand-in);
3. ``exec``-s the command with the placeholder replaced and ``$AREAL_NODE_ADDRESS`` set, so the
   pid, the signals and the exit code stay the command's own.

Like :mod:`areal.host.parent_death`, this file runs by path with ``python -I -S`` and imports the
standard library only: one bare interpreter start.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["ANNOUNCE", "NODE_ADDRESS_ENV", "NODE_HOST", "node_address", "on_node"]

NODE_HOST = "@node-address@"  # in a child's command line and URL: its node's address goes here
NODE_ADDRESS_ENV = "AREAL_NODE_ADDRESS"
ANNOUNCE = "[areal] node address: "
# Any address off this host: connecting a UDP socket sends nothing, it only picks the route.
_PROBE = ("10.254.254.254", 1)


def node_address() -> str:
    """Where the run's other processes reach this node (see the module docstring)."""
    given = os.environ.get(NODE_ADDRESS_ENV, "").strip()
    if given:
        return given
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(_PROBE)
            routed = str(sock.getsockname()[0])
        except OSError:  # no route off this machine: its name, as the resolver has it
            routed = ""
    if routed and not routed.startswith("127."):
        return routed
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def on_node(command: Sequence[str]) -> list[str]:
    """``command`` behind this shim (for a launcher to place)."""
    return [sys.executable, "-I", "-S", str(Path(__file__).resolve()), "--", *command]


def main(argv: Sequence[str]) -> None:
    command = list(argv[1:] if argv[:1] == ["--"] else argv)
    if not command:
        sys.exit("on_node: no command after --")
    address = node_address()
    sys.stdout.write(f"{ANNOUNCE}{address}\n")
    sys.stdout.flush()
    os.environ[NODE_ADDRESS_ENV] = address
    command = [part.replace(NODE_HOST, address) for part in command]
    try:
        os.execvp(command[0], command)
    except OSError as err:
        sys.exit(f"on_node: cannot run {command[0]}: {err}")


if __name__ == "__main__":
    main(sys.argv[1:])
