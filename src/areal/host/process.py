"""Start, health-check and stop one server subprocess (the embedded engine or SGLang).

The server runs in its own process group so that stopping it also stops the workers it forks
(SGLang starts a scheduler and a detokenizer per rank), and a run that exits without calling
:meth:`ServerProcess.stop` still takes its servers down through an ``atexit`` hook. A parent that
runs no exit code at all (SIGKILLed, crashed) takes them down too: each server starts behind
:func:`~areal.host.parent_death.guarded`, so it dies with the thread that started it (start
servers from a thread that lives as long as they should, as the supervisor's event loop does).
POSIX only.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import http.client
import os
import shutil
import signal
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from areal.host.clock import SYSTEM_CLOCK, Clock
from areal.host.parent_death import guarded

LOG_TAIL_LINES = 40
# How long a stop waits for a SIGKILLed process to be reaped. The process cannot refuse, so the
# wait only bounds the kernel's teardown: unmapping an engine's tens of GB and closing its GPU
# context take seconds, more on a busy machine. The caller needs the process gone (its port,
# memory and GPU free) when stop() returns, so the bound is generous; running out means the
# process is stuck in the kernel (uninterruptible sleep), which no longer wait would fix, and
# the error says so instead of the run hanging.
KILLED_EXIT_S = 30.0

# How a server that could not bind says so: strerror(EADDRINUSE), in Python's, uvicorn's and
# aiohttp's messages alike.
_ADDRESS_IN_USE = os.strerror(errno.EADDRINUSE).lower()

PORT_TRIES = 3  # ports a server's first start tries when another process takes the one picked
STOP_POLL_S = 0.05  # how often stop() looks whether the group has exited

_live: weakref.WeakSet[ServerProcess] = weakref.WeakSet()


class ServerExitedError(RuntimeError):
    """The server process died before it became healthy."""


class PortTakenError(ServerExitedError):
    """The server could not bind its port: another process took it after it was picked free.
    Nothing is wrong with the server; start it again on another port."""


def pick_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the OS says is free now (another process may still take it before we bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def with_port(command: Sequence[str]) -> Callable[[int], list[str]]:
    """``command`` with ``--port PORT`` appended, for :func:`start_on_free_port` (areal's
    servers and most others take their port so)."""
    return lambda port: [*command, "--port", str(port)]


def start_on_free_port(
    command_for: Callable[[int], Sequence[str]],
    *,
    log_path: str | os.PathLike[str],
    timeout: float,
    host: str = "127.0.0.1",
    tries: int = PORT_TRIES,
    **options: Any,
) -> ServerProcess:
    """A server started with ``command_for(port)`` on a port picked free, returned healthy (its
    ``url`` set); when another process bound that port first (:class:`PortTakenError`), started
    again on another, up to ``tries`` ports. ``options`` go to :class:`ServerProcess`; the
    server is stopped on any failure."""
    for attempt in range(tries):
        port = pick_free_port(host)
        server = ServerProcess(command_for(port), log_path=log_path, **options).start()
        try:
            server.wait_healthy(f"http://{host}:{port}", timeout)
            return server
        except PortTakenError:
            server.stop()
            if attempt == tries - 1:
                raise
        except BaseException:
            server.stop()
            raise
    raise AssertionError("unreachable")


class ServerProcess:
    """One server command: its process group, its log file, its health.

    ``env`` entries are added to (and override) the parent's environment; stdout and stderr both
    go to ``log_path``, appended, so a restart keeps the earlier log. ``die_with_parent``: the
    server is killed when this process dies, by any signal (:mod:`areal.host.parent_death`).
    ``serves_here``: the command itself listens, on this machine (False for a launcher's wrapper
    that runs the server elsewhere), so a health check can tell its answers from another
    process's on the same port (:mod:`areal.host.ports`). ``clock``: what the waits (health,
    a printed line, the grace of :meth:`stop`) read and sleep on (:mod:`areal.host.clock`).
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        log_path: str | os.PathLike[str],
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        name: str | None = None,
        die_with_parent: bool = True,
        stop_signal: signal.Signals = signal.SIGTERM,
        serves_here: bool = True,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if not command:
            raise ValueError("ServerProcess needs a non-empty command")
        self.command = [str(part) for part in command]
        self.log_path = Path(log_path)
        self.env = dict(env or {})
        self.cwd = cwd
        self.name = name or Path(self.command[0]).name
        self.die_with_parent = die_with_parent
        self.stop_signal = (
            stop_signal  # what asks it to stop (a launcher's wrapper may want SIGINT)
        )
        self.serves_here = serves_here
        self.clock = clock
        self.url: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._log_start = 0

    def __repr__(self) -> str:
        return f"ServerProcess({self.name!r}, pid={self.pid}, url={self.url!r})"

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> ServerProcess:
        if self._proc is not None:
            raise RuntimeError(f"{self.name} was already started (pid {self._proc.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env}
        command = self.command
        if self.die_with_parent:
            _check_executable(command[0], env)  # the wrapper would only exit 127
            command = guarded(command)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log_start = self._log.tell()  # where this start's output begins (restarts append)
        try:
            self._proc = subprocess.Popen(
                command,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.cwd,
                start_new_session=True,  # own session, own process group
            )
        except OSError:
            self._close_log()
            raise
        _live.add(self)
        return self

    def stop(self, timeout: float = 10.0) -> int | None:
        """``stop_signal`` (SIGTERM) to the whole group, SIGKILL what is left after ``timeout``;
        returns the exit code."""
        proc = self._proc
        if proc is None:
            return None
        deadline = self.clock.monotonic() + timeout
        try:
            self._signal_group(self.stop_signal)
            # The leader and the workers it forked (which may outlive it) share the ``timeout``;
            # whatever of the group is left then is SIGKILLed.
            while self.clock.monotonic() < deadline and (
                proc.poll() is None or self._group_alive()
            ):
                self.clock.sleep(STOP_POLL_S)
            self._signal_group(signal.SIGKILL)
            if proc.poll() is None:  # it dies; tearing down a big address space may take a while
                proc.wait(timeout=KILLED_EXIT_S)
        finally:
            _live.discard(self)
            self._close_log()
        return proc.returncode

    def kill(self) -> int | None:
        """SIGKILL the whole group at once (a stopped or hung server ignores SIGTERM until it runs
        again); returns the exit code."""
        proc = self._proc
        if proc is None:
            return None
        try:
            self._signal_group(signal.SIGKILL)
            proc.wait(timeout=KILLED_EXIT_S)
        finally:
            _live.discard(self)
            self._close_log()
        return proc.returncode

    def __enter__(self) -> ServerProcess:
        if self._proc is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self._proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone
            os.killpg(self._proc.pid, sig)

    def _group_alive(self) -> bool:
        assert self._proc is not None
        return _group_has_live_members(self._proc.pid)

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    # --- state ---------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the log, for error messages."""
        try:
            with open(self.log_path, "rb") as fh:
                tail = deque(fh, maxlen=lines)
        except FileNotFoundError:
            return ""
        return b"".join(tail).decode("utf-8", errors="replace").rstrip("\n")

    # --- health --------------------------------------------------------------------------------

    def wait_healthy(self, url: str, timeout: float, interval: float = 0.25) -> None:
        """Poll ``{url}/health`` until this server answers 200.

        Fails at once with :class:`ServerExitedError` if the process exits first
        (:class:`PortTakenError` when it could not bind its port), and with ``TimeoutError``
        after ``timeout`` seconds; both carry the log's last lines. A 200 from another process
        on the port is not this server's (``serves_here``).
        """
        if self._proc is None:
            raise RuntimeError(f"{self.name} was not started")
        base = url.rstrip("/")
        self.url = base
        health_url = base + "/health"
        port = urllib.parse.urlsplit(base).port
        deadline = self.clock.monotonic() + timeout
        last = "no answer yet"
        while True:
            code = self._proc.poll()
            if code is not None:
                what = f"exited with code {code} before {health_url} was healthy"
                if _ADDRESS_IN_USE in self.output().lower():
                    raise PortTakenError(self._failure(f"{what}: its port was taken"))
                raise ServerExitedError(self._failure(what))
            status = _health_status(health_url, timeout=max(0.1, min(5.0, interval * 8)))
            if status == "HTTP 200":
                if not self.serves_here or port is None:
                    return
                from areal.host.ports import group_listens_on  # psutil: only when asked

                if group_listens_on(port, self._proc.pid) is not False:
                    return
                status = f"another process answers on port {port}"
            last = status
            if self.clock.monotonic() >= deadline:
                raise TimeoutError(
                    self._failure(f"was not healthy at {health_url} after {timeout:g}s ({last})")
                )
            self.clock.sleep(interval)

    def wait_for_line(self, prefix: str, timeout: float, interval: float = 0.1) -> str:
        """The rest of the first line of this start's output that begins with ``prefix`` (a
        server announcing where it listens); fails like :meth:`wait_healthy`."""
        if self._proc is None:
            raise RuntimeError(f"{self.name} was not started")
        wanted = prefix.encode()
        deadline = self.clock.monotonic() + timeout
        while True:
            code = self._proc.poll()
            with open(self.log_path, "rb") as fh:
                fh.seek(self._log_start)
                for line in fh:
                    if line.startswith(wanted) and line.endswith(b"\n"):
                        return line[len(wanted) :].decode(errors="replace").strip()
            if code is not None:
                raise ServerExitedError(
                    self._failure(f"exited with code {code} before it printed {prefix!r}")
                )
            if self.clock.monotonic() >= deadline:
                raise TimeoutError(self._failure(f"printed no {prefix!r} in {timeout:g}s"))
            self.clock.sleep(interval)

    def output(self) -> str:
        """What this start has logged so far (the log also holds earlier starts': a restart, or
        a start that found its port taken, appends to it)."""
        with open(self.log_path, "rb") as fh:
            fh.seek(self._log_start)
            return fh.read().decode("utf-8", errors="replace")

    def _failure(self, what: str) -> str:
        tail = self.log_tail()
        shown = tail if tail else "(empty)"
        return (
            f"{self.name} (pid {self.pid}) {what}.\n"
            f"command: {' '.join(self.command)}\n"
            f"last {LOG_TAIL_LINES} lines of {self.log_path}:\n{shown}"
        )


# No proxies: the server is on 127.0.0.1 or the cluster network, never behind HTTP_PROXY.
# Health checks of local servers must not go through HTTP(S)_PROXY.
NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _health_status(url: str, timeout: float) -> str:
    """One ``GET`` of a health URL: ``"HTTP <code>"``, or the error's name when none came back."""
    try:
        with NO_PROXY_OPENER.open(url, timeout=timeout) as response:
            return f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:  # an answer, just not a 2xx one
        exc.close()
        return f"HTTP {exc.code}"
    except (OSError, http.client.HTTPException) as exc:  # refused, reset, timed out, garbled
        reason = getattr(exc, "reason", None)
        return type(reason if isinstance(reason, BaseException) else exc).__name__


def _check_executable(program: str, env: Mapping[str, str]) -> None:
    """``FileNotFoundError`` for a program that cannot be found, as ``Popen`` raises it."""
    if os.sep in program:
        found = os.path.isfile(program) and os.access(program, os.X_OK)
    else:
        found = shutil.which(program, path=env.get("PATH", os.defpath)) is not None
    if not found:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)


def _group_has_live_members(pgid: int) -> bool:
    """Whether a process group still has members that are not zombies.

    ``killpg(pgid, 0)`` alone also counts zombies, and orphans handed to a slow init (as in many
    containers) stay zombies for a while; where ``/proc`` exists we read the members' states.
    """
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we looked
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state not in ("Z", "X"):
            return True
    return False


@atexit.register
def _stop_leftovers() -> None:
    for server in list(_live):
        server.stop(timeout=5.0)


def wait_passing_on_stops(
    *procs: subprocess.Popen[bytes],
    grace: float = 60.0,
    interval: float = 0.2,
    clock: Clock = SYSTEM_CLOCK,
) -> tuple[int, bool]:
    """Wait for ``procs``, the trainer's processes started by this one (one per node); a SIGINT
    or SIGTERM meanwhile is passed on to each as SIGINT, the trainer's graceful stop. One that
    fails stops the others the same way (SIGKILL after ``grace`` seconds): a trainer node alone
    would wait for its peers until the collectives time out. Returns the first failure's exit
    code (else 0) and whether a stop was passed on. ``clock`` times the grace and the polls."""
    signalled: list[int] = []

    def stop_all(signum: int) -> None:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signum)

    def forward(signum: int, _frame: object) -> None:
        signalled.append(signum)
        stop_all(signal.SIGINT)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    failed: int | None = None
    stopping_since: float | None = None
    try:
        while True:
            codes = [proc.poll() for proc in procs]
            for code in codes:
                if code and failed is None:
                    failed = code
            if all(code is not None for code in codes):
                break
            if failed is not None and stopping_since is None:
                stopping_since = clock.monotonic()
                stop_all(signal.SIGINT)
            elif stopping_since is not None and clock.monotonic() - stopping_since > grace:
                stop_all(signal.SIGKILL)
            clock.sleep(interval)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return failed or 0, bool(signalled)
