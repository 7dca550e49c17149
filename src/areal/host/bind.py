"""Which addresses a server may listen on without being told it is meant to be reached remotely.

The gateway holds the operator's upstream key and the session API; an engine takes any prompt.
Both listen on loopback unless started with ``--allow-remote``: ``--host 0.0.0.0`` alone is
refused with one line, so no server is exposed by a typo or a copied command line.
"""

from __future__ import annotations

import ipaddress
import socket


def is_loopback(host: str) -> bool:
    """True when every address ``host`` names is a loopback one (``127.0.0.0/8``, ``::1``).

    ``""``, ``0.0.0.0`` and ``::`` (every interface) are not; a name is resolved, and one that
    does not resolve is not either.
    """
    host = host.strip().strip("[]")
    if not host:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        return False
    addresses = {info[4][0] for info in infos}
    return bool(addresses) and all(
        ipaddress.ip_address(str(a).split("%", 1)[0]).is_loopback for a in addresses
    )


def remote_bind_refusal(host: str, allow_remote: bool, server: str) -> str | None:
    """The one line refusing ``--host host`` for ``server``, or None when it may listen there."""
    if allow_remote or is_loopback(host):
        return None
    return (
        f"--host {host or repr(host)} would let other machines reach the {server}; it listens on "
        "loopback (127.0.0.1) unless you also pass --allow-remote (then put TLS or a firewall "
        "in front of it)"
    )
