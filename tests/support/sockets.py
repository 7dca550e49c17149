"""Which network connections a block of code makes, observed rather than assumed.

CPython raises an audit event for every ``socket.connect`` and ``socket.getaddrinfo`` any library
makes; :func:`watch_sockets` records them while its block runs, and :func:`outside` names those
that reach past loopback (a lookup of a public name counts: it is how a download starts).
"""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

Seen = list[tuple[str, Any]]  # ("connect", address) and ("lookup", host)

_watching: list[Seen] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _watching:
        return
    if event == "socket.connect":
        _watching[-1].append(("connect", args[1]))
    elif event == "socket.getaddrinfo":
        _watching[-1].append(("lookup", args[0]))


sys.addaudithook(_audit)  # audit hooks cannot be removed; it does nothing unless a block watches


@contextmanager
def watch_sockets() -> Iterator[Seen]:
    """The connections and lookups made inside the block, from any thread."""
    seen: Seen = []
    _watching.append(seen)
    try:
        yield seen
    finally:
        _watching.remove(seen)


def is_loopback(host: Any) -> bool:
    if isinstance(host, bytes):
        host = host.decode()
    if host in ("localhost", None):
        return True
    try:
        address = ipaddress.ip_address(str(host))
    except ValueError:
        return False  # a name that is not localhost
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def outside(seen: Seen) -> Seen:
    """What of ``seen`` reached past loopback (AF_UNIX paths are local)."""
    bad = []
    for kind, target in seen:
        if isinstance(target, str) and kind == "connect":
            continue  # an AF_UNIX path
        host = target[0] if isinstance(target, tuple) else target
        if not is_loopback(host):
            bad.append((kind, target))
    return bad
