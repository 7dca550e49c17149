"""Who holds a TCP port: "port 9000 is taken" is only useful with the pid and command line; and
a health check must not take another process's answer on its server's port for the server's.

psutil reads ``/proc/net/tcp*`` and matches socket inodes to ``/proc/<pid>/fd``; processes of
other users stay anonymous unless we run as root, which the report says instead of guessing.
"""

from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass
from typing import Any

import psutil


@dataclass(frozen=True)
class PortHolder:
    """One process listening on a port; ``pid`` is None when the OS does not tell us."""

    pid: int | None
    command: str  # the command line, or why it is unknown
    address: str  # where it listens, e.g. 127.0.0.1:9000

    def describe(self) -> str:
        if self.pid is None:
            return f"a process of another user on {self.address} ({self.command})"
        return f"pid {self.pid} ({self.command}) on {self.address}"


def port_holders(port: int) -> list[PortHolder]:
    """Processes listening on TCP ``port`` (any address); empty when the port is free.

    When nobody is seen listening but the port still cannot be bound (a socket in TIME_WAIT, a
    platform psutil cannot read), one anonymous holder is returned, so "free" stays truthful.
    """
    holders: list[PortHolder] = []
    for conn in _listeners(port) or []:
        if conn.pid is not None and any(h.pid == conn.pid for h in holders):
            continue  # the same server on IPv4 and IPv6
        address = f"{conn.laddr.ip}:{conn.laddr.port}"
        holders.append(PortHolder(conn.pid, _command_line(conn.pid), address))
    if not holders and not _bindable(port):
        holders.append(PortHolder(None, "not visible to this user", f"127.0.0.1:{port}"))
    return holders


def group_listens_on(port: int, pgid: int) -> bool | None:
    """Whether a process of group ``pgid`` listens on TCP ``port`` (any address); None where
    the OS does not say. A server's port is picked free and bound by the server a moment later:
    another process may bind it in between, and its ``/health`` must not pass for the server's
    (:meth:`areal.host.process.ServerProcess.wait_healthy`)."""
    conns = _listeners(port)
    if conns is None:
        return None
    for conn in conns:
        with contextlib.suppress(OSError):  # gone since the listing
            if conn.pid is not None and os.getpgid(conn.pid) == pgid:
                return True
    return False


def _listeners(port: int) -> list[Any] | None:
    """The sockets listening on TCP ``port``; None when the OS will not list them."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    return [c for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port]


def _command_line(pid: int | None) -> str:
    if pid is None:
        return "run as root to see it"
    try:
        proc = psutil.Process(pid)
        return " ".join(proc.cmdline()) or proc.name()
    except psutil.Error:
        return "exited"


def _bindable(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
