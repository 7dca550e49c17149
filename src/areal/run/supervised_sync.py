"""Weight sync inside a supervised run: publish to the engines that are up, skip one that dies
mid-publish (its restart catches up). The sync itself (disk or a collective) is the training
engine's (:meth:`~areal.core.train_engine.TrainEngine.weight_sync`).

An engine that stalls (stopped, hung: alive, but no answer within the sync's watchdog timeout,
``inference.weight_sync_timeout_s``) is treated as the supervisor treats an engine that died: the
watchdog's one log line names it (name, URL, pid, phase), it is killed, and the supervisor
restarts it, up to its restart limit, on the newest weights; the publish goes on without it.
Waiting for it would stop the run for good (every rollout waits on a paused engine), and an
engine that cannot answer a pause cannot be trusted with the next update either.

Engines the run did not start (attached to its gateway mid-run: ``areal serve inference
--attach``, ``POST /rl/engines``) get every publish too, under every sync: before each one the
gateway's list is read (:func:`gateway_engines`) and its healthy engines that are not the run's
join the sync's engines. A disk sync makes them load the version; a collective one re-forms its
group with them. Until then the gateway holds them, taking no traffic
(:mod:`areal.gateway.engine_pool`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

from areal.core.train_engine import StagedWeightSync, WeightSync, WeightSyncError, is_staged
from areal.host.faults import crash_point
from areal.host.process import ServerProcess
from areal.run.gateway_client import GatewayAdmin, best_effort
from areal.run.supervisor import Child, Supervisor

log = logging.getLogger("areal.train")


def gateway_engines(gateway: GatewayAdmin) -> Callable[[], Awaitable[list[str]]]:
    """The healthy, not draining engines attached to ``gateway``, asked before every publish; a
    gateway that does not answer (restarting): none this time, the next publish asks again."""

    async def listed() -> list[str]:
        listing = await best_effort(gateway.engines())
        if listing is None:
            return []
        return [e["url"] for e in listing["engines"] if e.get("healthy") and not e.get("draining")]

    return listed


# How long a sync that lost its connection to one of the run's engines waits for that engine's
# process to be seen gone before it calls the failure the engine's own: the connection drops as
# the kernel tears a killed engine down, a moment before its process is reaped.
DIED_GRACE_S = 3.0
DIED_POLL_S = 0.05


class SupervisedSync:
    """The engine's weight sync, to the engines that are up; one that died mid-publish is skipped (its
    restart loads the newest weights), any other failure stops the run."""

    def __init__(
        self,
        sync: WeightSync,
        supervisor: Supervisor,
        lock: asyncio.Lock,
        *,
        others: Callable[[], Awaitable[list[str]]] | None = None,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self.sync = sync
        self.supervisor = supervisor
        self.lock = lock
        # The grace for a dying engine (:meth:`_died`) reads ``clock`` (default: the event
        # loop's) and waits with ``sleep``: a test proves the rule with a fake clock.
        self.clock = clock
        self.sleep = sleep
        # Engines the run did not start (attached to its gateway by others), asked before every
        # publish; one that fails is left out (the gateway's health checks take it out of
        # service, and its next attach loads the newest weights first).
        self.others = others

    @property
    def staged(self) -> bool:
        """Can the engines load a version while the next step trains (:meth:`save`, then
        :meth:`deliver`)? A disk sync can; a collective broadcast reads the live weights."""
        return is_staged(self.sync)

    async def publish(self, model: Any, version: int) -> float:
        return await self._to_engines(version, lambda: self.sync.publish(model, version))

    async def save(self, model: Any, version: int) -> float:
        """The half of a staged publish that reads ``model`` (no engine is involved)."""
        assert is_staged(self.sync)
        return await cast(StagedWeightSync, self.sync).save(model, version)

    async def deliver(self, version: int) -> float:
        """The engines load the saved ``version``, with :meth:`publish`'s handling of engines
        that die or stall meanwhile."""
        assert is_staged(self.sync)
        staged = cast(StagedWeightSync, self.sync)
        return await self._to_engines(version, lambda: staged.deliver(version))

    async def _to_engines(self, version: int, call: Callable[[], Awaitable[float]]) -> float:
        """``call`` (a publish or a delivery) to the engines that are up, again without one that
        died or stalled meanwhile (up to 3 tries)."""
        async with self.lock:
            crash_point("weight_sync.to_engines")  # a test may hold the run here (host.faults)
            left_out: set[str] = set()
            for _attempt in range(3):
                children = [c for c in self.supervisor.children if c.name.startswith("engine")]
                engines = [c for c in children if c.up and c.running and c.url]
                own = [c.url for c in engines if c.url]
                ours = {c.url for c in children}  # one restarting is the supervisor's to catch up
                others = [u for u in await self._others() if u not in ours and u not in left_out]
                self.sync.engine_urls = own + others
                seen = {c.url: c.process for c in engines}
                try:
                    return await call()
                except WeightSyncError as err:
                    if err.url in others:
                        left_out.add(err.url or "")
                        log.warning(
                            "%s (attached by others) failed the weight sync: %s", err.url, err
                        )
                        continue
                    if err.stalled and await self._kill_stalled(err, seen.get(err.url), version):
                        continue
                    if not await self._died(err.url, seen.get(err.url)):
                        raise
                    log.warning("%s died during the weight sync; it will catch up", err.url)
            raise WeightSyncError("publish", None, "engines kept dying during the weight sync")

    async def _others(self) -> list[str]:
        return await self.others() if self.others is not None else []

    async def _kill_stalled(
        self, err: WeightSyncError, process: ServerProcess | None, version: int
    ) -> bool:
        """Kill the engine that stalled, if it is one of the run's and still that process (the
        supervisor restarts it); ``False`` when there is nothing of ours to kill."""
        child = self._child(err.url)
        if child is None or process is None or child.process is not process:
            return False
        if process.running:
            log.warning(
                "the weight sync's watchdog: %s (%s, pid %s) stalled in the sync of version %d "
                "(%s); killing it, the supervisor restarts it on the newest weights",
                child.name,
                child.url,
                process.pid,
                version,
                err,
            )
            await asyncio.to_thread(process.kill)
        return True

    def _child(self, url: str | None) -> Child | None:
        return next((c for c in self.supervisor.children if url and c.url == url), None)

    async def _died(self, url: str | None, process: ServerProcess | None) -> bool:
        """Did the engine at ``url`` die (the process the sync talked to has exited, or the
        supervisor already replaced it)? A killed engine's connection can drop a moment before
        its process is gone, so this waits up to :data:`DIED_GRACE_S` for the process to say so."""
        child = self._child(url)
        if child is None or process is None:
            return False
        clock = self.clock or asyncio.get_running_loop().time
        deadline = clock() + DIED_GRACE_S
        while True:
            if child.process is not process or not process.running:
                return True
            if clock() > deadline:
                return False
            await self.sleep(DIED_POLL_S)

    async def close(self) -> None:
        await self.sync.close()
