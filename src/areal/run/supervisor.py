"""Keep a run's processes alive: start them, watch them, restart the ones that die, stop them all.

A run (``areal train``) is several processes: inference engines, the gateway, rollout workers.
Each is a :class:`Child`: a way to build its command (called again for every restart, so a
restarted engine can start from the newest weights), an optional health URL, and hooks around a
restart (a rollout worker's open sessions are discarded before it comes back; an engine catches
up with the trainer's weights after). :meth:`Supervisor.watch` polls them; a child that exits is
restarted, up to ``max_restarts`` times, after which the run stops with :class:`ChildFailed`
naming the child and quoting its log. Every child has its name in its environment
(``AREAL_PROCESS=engine0``: ``ps e``, and the fault tests, tell them apart by it) and dies with the
run, by any signal (:mod:`areal.host.parent_death`): the supervisor starts them all from its event
loop's thread, which lives as long as the run. Pure Python: no torch.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from areal.core.launcher import Launcher, LocalLauncher, Placement
from areal.host.on_node import ANNOUNCE, NODE_ADDRESS_ENV, NODE_HOST, on_node
from areal.host.process import PORT_TRIES, PortTakenError, ServerProcess

log = logging.getLogger("areal.supervisor")

Hook = Callable[["Child"], Awaitable[None]]

PROCESS_ENV = "AREAL_PROCESS"  # a child's name, in its environment


class ChildFailed(RuntimeError):
    """A child process died for good (or never became healthy): the run cannot go on."""


@dataclass(eq=False)
class Child:
    """One supervised process (see the module docstring)."""

    name: str
    command: Callable[[], Sequence[str]]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    # Polled at {url}/health until it answers 200. With NODE_HOST in it (a server that listens on
    # its node's address), the child's command has it too, and the url is the node's once the
    # child announces it (areal.host.on_node).
    url: str | None = None
    start_timeout: float = 180.0
    max_restarts: int = 3
    stage: int = 0  # start_all starts stage 0 first (all at once), then 1, ...
    cpus: set[int] | None = None  # CPU affinity, set right after the process starts
    nice: int = 0  # added to its niceness right after the process starts (0: left as it is)
    placement: Placement | None = None  # what the launcher needs to place it (None: here)
    before_restart: Hook | None = None
    after_start: Hook | None = None  # after every start that became healthy, first one included
    restarts: int = 0
    up: bool = False
    process: ServerProcess | None = None
    url_template: str | None = None  # the url as given, while ``url`` is where it is now
    # Picks the child another free port (its command has it from then on) and returns its url:
    # a first start whose port another process took in the meantime tries again there. Later
    # restarts keep the port, which the rest of the run knows the child by ...
    new_port: Callable[[], str] | None = None
    # ... unless the child may move: a restart whose port another process took (a freed port
    # is anyone's) tries again on another one too. Only for a child whose new url its
    # ``after_start`` passes on to the rest of the run (an engine: the weight sync, the gateway).
    moves_when_taken: bool = False

    def __post_init__(self) -> None:
        if self.url is not None:
            self.move_to(self.url)

    def move_to(self, url: str) -> None:
        """Where the child listens from its next start on (NODE_HOST: its node's address)."""
        self.url = url
        self.url_template = url if NODE_HOST in url else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.running


class Supervisor:
    """Starts children, restarts the ones that exit, and stops them all (module docstring)."""

    def __init__(
        self,
        children: Sequence[Child] = (),
        *,
        poll_interval: float = 0.5,
        on_spawn: Callable[[Child], None] | None = None,
        launcher: Launcher | None = None,
    ) -> None:
        self.children: list[Child] = list(children)
        self.launcher: Launcher = launcher or LocalLauncher()
        self.poll_interval = poll_interval
        self.on_spawn = on_spawn  # after every (re)start, e.g. to note its pid
        self._stopping = False

    def add(self, child: Child) -> Child:
        self.children.append(child)
        return child

    async def start_all(self) -> None:
        """Start the children stage by stage (a stage's children at once), each healthy before
        the next stage starts: the gateway needs its engines up, the workers their gateway."""
        for stage in sorted({c.stage for c in self.children}):
            group = [c for c in self.children if c.stage == stage]
            for child in group:
                self._spawn(child)
            await asyncio.gather(*(self._healthy_moving_if_taken(child) for child in group))

    async def watch(self) -> None:
        """Run until cancelled; raises :class:`ChildFailed` when a child is beyond saving."""
        while not self._stopping:
            for child in list(self.children):
                if child.up and not child.running and not self._stopping:
                    await self._restart(child)
            await asyncio.sleep(self.poll_interval)

    def stop_all(self, timeout: float = 10.0) -> None:
        """SIGTERM every child (SIGKILL after ``timeout``), rollout workers first."""
        self._stopping = True
        for child in reversed(self.children):
            child.up = False
            if child.process is not None:
                child.process.stop(timeout=timeout)

    # --- internals ------------------------------------------------------------------------------

    def _spawn(self, child: Child) -> None:
        env = {**os.environ, **child.env, PROCESS_ENV: child.name}
        command = list(child.command())
        placed = child.placement is not None and self.launcher.name != "local"
        if placed:  # this node's address is not the placed child's: its node tells it
            env.pop(NODE_ADDRESS_ENV, None)
        if child.url_template is not None and not placed:
            raise ChildFailed(
                f"{child.name} listens on its node's address, which only a launcher that "
                f"places processes finds (launcher.name is {self.launcher.name})"
            )
        if placed:
            assert child.placement is not None
            if child.url_template is not None:
                command = on_node(command)  # it learns its node's address there, and says it
            command = self.launcher.wrap(child.placement, command)
        stop = getattr(self.launcher, "stop_signal", signal.SIGTERM) if placed else signal.SIGTERM
        child.process = ServerProcess(
            command,
            log_path=child.log_path,
            env=env,
            name=child.name,
            stop_signal=stop,
            serves_here=not placed,
        )
        child.process.start()
        if not placed and child.process.pid is not None:
            # Before the interpreter starts its threads, which inherit the mask and niceness
            # (both are per thread on Linux: set now, they hold for the whole process).
            if child.cpus:
                os.sched_setaffinity(child.process.pid, child.cpus)
            if child.nice:  # relative to what it inherited: lowering it needs privileges
                pid = child.process.pid
                os.setpriority(
                    os.PRIO_PROCESS, pid, min(19, os.getpriority(os.PRIO_PROCESS, pid) + child.nice)
                )
        if self.on_spawn is not None:
            self.on_spawn(child)

    async def _healthy_moving_if_taken(self, child: Child) -> None:
        """Become healthy; on a port another process took after it was picked (each test worker,
        each run on a shared machine picks its own) or freed, start again on another one (up to
        ``PORT_TRIES`` ports in all)."""
        for _ in range(PORT_TRIES - 1):
            try:
                await self._become_healthy(child)
                return
            except ChildFailed as err:
                if child.new_port is None or not isinstance(err.__cause__, PortTakenError):
                    raise
            assert child.process is not None
            child.process.stop(timeout=1.0)
            taken = child.url
            child.move_to(child.new_port())
            log.warning(
                "%s: %s was taken by another process; trying %s", child.name, taken, child.url
            )
            self._spawn(child)
        await self._become_healthy(child)

    async def _become_healthy(self, child: Child) -> None:
        process = child.process
        assert process is not None
        if child.url is not None:
            try:
                if child.url_template is not None:
                    host = await asyncio.to_thread(
                        process.wait_for_line, ANNOUNCE, child.start_timeout
                    )
                    child.url = child.url_template.replace(NODE_HOST, host)
                    log.info("%s runs on %s: %s", child.name, host, child.url)
                await asyncio.to_thread(process.wait_healthy, child.url, child.start_timeout)
            except (TimeoutError, RuntimeError) as err:
                raise ChildFailed(str(err)) from err
        if child.after_start is not None:
            await child.after_start(child)
        child.up = True

    async def _restart(self, child: Child) -> None:
        assert child.process is not None
        code = child.process.returncode
        child.up = False
        if child.restarts >= child.max_restarts:
            raise ChildFailed(
                f"{child.name} exited with code {code} and was already restarted "
                f"{child.restarts} times; giving up. Last lines of {child.log_path}:\n"
                f"{child.process.log_tail()}"
            )
        child.restarts += 1
        log.warning(
            "%s exited with code %s; restarting it (%d/%d)",
            child.name,
            code,
            child.restarts,
            child.max_restarts,
        )
        child.process.stop(timeout=1.0)
        if child.before_restart is not None:
            await child.before_restart(child)
        self._spawn(child)
        if child.moves_when_taken:
            await self._healthy_moving_if_taken(child)
        else:
            await self._become_healthy(child)
        log.warning("%s is back (pid %s) on %s", child.name, child.process.pid, child.url)
