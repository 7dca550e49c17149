"""Why a gateway cannot be reached, in one sentence a user can act on.

"Connection refused" alone sends people hunting (the seed article's "local proxy failed, gateway
at localhost:9000 not reachable"). Three causes cover nearly every case, and each has its own fix:
nothing listens on that port (start the gateway, or fix the URL), another process holds the port
(stop it or pick another port), or the gateway is still starting (wait: readiness is awaited by
health checks, never by a fixed sleep). The message names the gateway's log when one is known.
"""

from __future__ import annotations

import itertools
import json
import os
import time
import urllib.error
from pathlib import Path
from urllib.parse import urlsplit

from areal.host.process import NO_PROXY_OPENER

RECENT_S = 120.0  # a log written this recently suggests a gateway that is still starting


def describe_unreachable(url: str, *, log_path: str | Path | None = None) -> str:
    """One sentence: what is (not) at ``url`` and what to do about it."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    where = f"{host}:{port}"
    health = _health(f"{parts.scheme or 'http'}://{where}/health")
    if health == "gateway":
        return f"the gateway at {url} answers /health now; it was not ready or was restarting"
    log = _log_note(log_path)
    holders = _holders(port) if _is_local(host) else []
    if health is not None:  # something answers HTTP there, and it is not an areal gateway
        who = holders[0] if holders else "another server"
        return (
            f"another process holds port {port}: {who}; it is not an areal gateway "
            f"(GET /health answered {health}); stop it or start the gateway on another port{log}"
        )
    if holders:
        return (
            f"{holders[0]} listens on port {port} but does not answer HTTP yet: a gateway that "
            f"is still starting (wait for GET {url}/health to answer) or a server of another "
            f"kind{log}"
        )
    starting = _starting_gateway(port)
    if starting:
        return (
            f"nothing listens on {where} yet, but {starting} is running: the gateway is still "
            f"starting (its engines load first); wait for GET {url}/health{log}"
        )
    return (
        f"nothing listens on {where}: start the gateway (`areal serve gateway --port {port}`) "
        f"or fix the URL{log}"
    )


def _health(url: str) -> str | None:
    """``"gateway"`` when an areal gateway answers; else what answered (status); None: nothing."""
    try:
        with NO_PROXY_OPENER.open(url, timeout=2.0) as resp:  # a proxy would answer for it
            body = resp.read(4096)
    except urllib.error.HTTPError as err:
        return f"HTTP {err.code}"
    except (urllib.error.URLError, OSError, ValueError):
        return None
    try:
        if json.loads(body) == {"status": "ok"}:
            return "gateway"
    except ValueError:
        pass
    return "HTTP 200 with a body that is not the gateway's"


def _holders(port: int) -> list[str]:
    from areal.host.ports import port_holders

    return [holder.describe() for holder in port_holders(port)]


def _starting_gateway(port: int) -> str | None:
    """A running gateway process for this port (``areal serve gateway --port N`` or
    ``python -m areal.gateway.server --port N``), by its command line."""
    import psutil

    for proc in psutil.process_iter(["pid", "cmdline"]):
        args = proc.info.get("cmdline") or []
        if proc.info["pid"] != os.getpid() and is_gateway_command(args, port):
            return f"pid {proc.info['pid']} ({' '.join(args)[:120]})"
    return None


def is_gateway_command(args: list[str], port: int) -> bool:
    serves = "areal.gateway.server" in args or any(
        a == "serve" and b == "gateway" for a, b in itertools.pairwise(args)
    )
    ports = {b for a, b in itertools.pairwise(args) if a == "--port"}
    ports |= {a.removeprefix("--port=") for a in args if a.startswith("--port=")}
    return serves and str(port) in ports


def _log_note(log_path: str | Path | None) -> str:
    if log_path is None:
        return ""
    path = Path(log_path)
    if not path.exists():
        return f"; its log {path} does not exist (was it started with that log directory?)"
    age = time.time() - path.stat().st_mtime
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    last = f", last line: {lines[-1].strip()[:200]}" if lines else ""
    fresh = "" if age > RECENT_S else " (written just now)"
    return f"; its log: {path}{fresh}{last}"


def _is_local(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1", "0.0.0.0")
