"""Whose is the server on a port: a health check must not take another process's answer for ours.

A server's port is picked free (:func:`~areal.core.process.pick_free_port`) and bound by the
server a moment later; in between another process may bind it. Our server then exits with
"address already in use", but until it has, ``GET /health`` on that port reaches the other
process, and a 200 from it would send the run's traffic there. Linux tells who listens where:
``/proc/net/tcp{,6}`` lists the listening sockets by inode, and ``/proc/<pid>/fd`` the sockets a
process holds. Standard library only; elsewhere the answer is "unknown".
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["group_listens_on"]

_LISTEN = "0A"  # the TCP state column of a listening socket in /proc/net/tcp
_PROC = Path("/proc")


def group_listens_on(port: int, pgid: int) -> bool | None:
    """Whether a process of group ``pgid`` holds a socket listening on TCP ``port`` (any address);
    None where the kernel does not say (no ``/proc``)."""
    if not (_PROC / "net" / "tcp").exists():
        return None
    listening = set(_listening_inodes(port))
    if not listening:
        return False
    return any(inode in listening for pid in _group_members(pgid) for inode in _socket_inodes(pid))


def _listening_inodes(port: int) -> Iterator[int]:
    wanted = f"{port:04X}"
    for table in ("tcp", "tcp6"):
        try:
            lines = (_PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
            if len(fields) > 9 and fields[3] == _LISTEN and fields[1].rsplit(":", 1)[1] == wanted:
                yield int(fields[9])


def _group_members(pgid: int) -> Iterator[int]:
    for entry in os.scandir(_PROC):
        if not entry.name.isdigit():
            continue
        try:
            stat = (_PROC / entry.name / "stat").read_text()
        except OSError:  # gone since the listing
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses, so split after it
        after_comm = stat.rsplit(")", 1)[1].split()
        if len(after_comm) > 2 and int(after_comm[2]) == pgid:
            yield int(entry.name)


def _socket_inodes(pid: int) -> Iterator[int]:
    fd_dir = _PROC / str(pid) / "fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:  # gone, or not ours to read
        return
    for fd in fds:
        try:
            target = os.readlink(fd_dir / fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            yield int(target[len("socket:[") : -1])
