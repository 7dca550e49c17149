"""The policy's engines as the gateway holds them: attached and detached while it runs,
health-checked, and every call tracked, so a call on an engine that leaves ends as *lost*.

A gateway can start with no engine at all (a long-lived service: engines come and go, a trainer
attaches its own); until one is attached, the policy answers ``503`` with ``Retry-After``. Calls
go to the *live* engine (attached, healthy, not draining) running the fewest calls, or sticky per
conversation. An engine stops being live when

- it is detached (``DELETE /rl/engines``): with ``drain``, its running calls finish first (up to a
  timeout); without, they are cancelled at once;
- it fails ``DOWN_AFTER`` health checks in a row, or a call cannot reach it: its running calls are
  cancelled, and it takes traffic again as soon as it answers a health check (a supervisor that
  restarted it at the same URL needs nothing more).

An engine is *held* while it does not serve the run's version: once a trainer has announced a
version (:meth:`EnginePool.announced`, from ``POST /rl/version``), an engine attached with another
version label (an older one, another run's, or one that is no version at all: SGLang's and
vLLM's start-up ``"default"``) takes no traffic until it reports the run's version. The trainer
gives it its next version (a disk sync loads it from the file system, a collective sync
re-forms its group with it), then announces it; the pool then reads the engine's
``/model_info`` again (also at every health round) and lets it serve. Its tokens would otherwise
be sampled from weights the run never trained. Held engines serve only when no other engine is
live: their labels say what they serve (the trainer drops a sample whose label is not a run
version, and counts an old one as that stale), and a run whose every engine is held must still
produce the batch that publishes the version they wait for.

A cancelled call raises :class:`EngineLost` (a 503 with ``Retry-After``). The policy retries a
lost call that produced nothing yet on another live engine; a call lost half-way is noted in the
request's :data:`LOST_CALLS` box, and the middleware marks the episode it belonged to, which then
ends discarded: a trajectory with a hole in it is never trained on.

The calls a session's key makes are also tracked in its :class:`CallGroup` (the request's
:data:`CALL_GROUP`): when the session ends, those still running are cut (``409
session_ended``). Cancelling the engine call closes its connection, and the engine aborts the
generation (SGLang, vLLM and the embedded engine all do on a client that goes away): an episode
nobody will train (its group was trained without it, it grew too stale) stops costing tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import time
import zlib
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from areal.core.engine_client import EngineClient, engine_client
from areal.core.types import version_number
from areal.gateway.errors import GatewayError

log = logging.getLogger("areal.gateway.engines")

T = TypeVar("T")

RETRY_AFTER_S = 5  # what a 503 for "no engine" tells clients to wait
HEALTH_EVERY_S = 5.0
HEALTH_TIMEOUT_S = 10.0
DOWN_AFTER = 3  # failed health checks in a row before an engine takes no traffic

# One box per request (the middleware sets it): the engines whose calls this request lost.
# A list, not a value, so the tasks a handler starts (n > 1 choices) add to the same box.
LOST_CALLS: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "areal_lost_calls", default=None
)


def cancel_running(calls: set[asyncio.Future[Any]]) -> int:
    """Cancel the calls not done yet; returns how many."""
    running = [c for c in calls if not c.done()]
    for call in running:
        call.cancel()
    return len(running)


class CallGroup:
    """The engine calls of one session still running, cut together when it ends."""

    def __init__(self) -> None:
        self.calls: set[asyncio.Future[Any]] = set()
        self.cut_why: str | None = None  # set once cut: why its calls were cancelled

    def cut(self, why: str) -> int:
        """Cancel the running calls (and any made later): each raises ``409 session_ended``."""
        self.cut_why = why
        return cancel_running(self.calls)

    def error(self) -> GatewayError:
        # The SDKs retry a 409 unless told not to; the session's key is dead, so say so.
        return GatewayError(
            409,
            self.cut_why or "the session ended",
            code="session_ended",
            headers={"x-should-retry": "false"},
        )


# The call group of the session whose key made the request (the middleware sets it), if any.
CALL_GROUP: contextvars.ContextVar[CallGroup | None] = contextvars.ContextVar(
    "areal_call_group", default=None
)


class EngineLost(GatewayError):
    """A call whose engine was detached or went down while it ran."""

    def __init__(self, url: str, why: str) -> None:
        super().__init__(
            503,
            f"the inference engine at {url} {why} while serving this call; retry",
            code="engine_lost",
            headers={"Retry-After": "1"},
        )
        self.url = url


@dataclass(eq=False)
class Engine:
    """One attached engine and the calls running on it."""

    url: str
    client: EngineClient = field(repr=False)
    backend: str
    owner: str | None = None  # who attached it (a trainer's id), for GET /rl/engines
    weight_version: str | None = None
    held: bool = False  # it does not serve the run's version: no traffic while others can
    healthy: bool = True
    draining: bool = False
    detached: bool = False
    failures: int = 0  # failed health checks in a row
    served: int = 0
    attached_at: float = field(default_factory=time.time)
    calls: set[asyncio.Future[Any]] = field(default_factory=set, repr=False)
    lost_why: str = ""

    @property
    def live(self) -> bool:
        return self.healthy and not self.draining and not self.detached

    def describe(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "backend": self.backend,
            "owner": self.owner,
            "healthy": self.healthy,
            "draining": self.draining,
            "running": len(self.calls),
            "served": self.served,
            "weight_version": self.weight_version,
            "held": self.held,
            "attached_s": round(time.time() - self.attached_at, 1),
        }

    def cancel_calls(self, why: str) -> int:
        self.lost_why = why
        return cancel_running(self.calls)


class _StreamReader:
    """A stream's stand-in in ``engine.calls``: ``call`` is cancelled when the engine leaves,
    and then the task reading the stream is cancelled if it is reading at that moment."""

    def __init__(self, call: asyncio.Future[None]) -> None:
        self.task: asyncio.Task[Any] | None = None  # the task of the read in progress
        self.call = call
        self.reading = False
        self.interrupted = False
        call.add_done_callback(self._on_done)

    def _on_done(self, call: asyncio.Future[None]) -> None:
        if call.cancelled() and self.reading and self.task is not None:
            self.interrupted = True
            self.task.cancel()

    def lost(self) -> bool:
        """Was the read cancelled by the engine leaving, and by nothing else (the request's own
        cancellation, e.g. a client that went away, stays a cancellation)?"""
        return self.interrupted and self.task is not None and self.task.uncancel() == 0


class EnginePool:
    """The attached engines; ``pick`` chooses one for a call, ``call``/``stream`` track it."""

    def __init__(
        self,
        backend: str | None = None,
        *,
        health_every: float = HEALTH_EVERY_S,
        health_timeout: float = HEALTH_TIMEOUT_S,
        down_after: int = DOWN_AFTER,
    ) -> None:
        self.backend = backend or "embedded"
        self.health_every = health_every
        self.health_timeout = health_timeout
        self.down_after = down_after
        self.engines: dict[str, Engine] = {}
        # The version the run's trainer last announced (None: no trainer has; nothing is held).
        self.run_version: int | None = None
        self._turn = itertools.count()
        self._health: asyncio.Task[None] | None = None
        self._rechecks: set[asyncio.Task[None]] = set()

    # --- membership --------------------------------------------------------------------------

    def client_for(self, url: str, backend: str | None = None) -> EngineClient:
        return engine_client(backend or self.backend, url)

    def add(self, engine: Engine) -> Engine:
        """Attach ``engine`` (one already attached at that URL is replaced by it); held if it
        does not serve the run's version (module docstring)."""
        old = self.engines.pop(engine.url, None)
        if old is not None:
            old.detached = True
            old.cancel_calls("was attached again")
        self.engines[engine.url] = engine
        log.info("engine %s attached (%s); %d attached", engine.url, engine.backend, len(self))
        self._hold_unless_current(engine)
        return engine

    def _hold_unless_current(self, engine: Engine) -> None:
        run = self.run_version
        if run is not None and version_number(engine.weight_version) != run:
            engine.held = True
            log.info(
                "engine %s serves version %s, not the run's %d: it takes traffic once the "
                "trainer's next publish reaches it",
                engine.url,
                engine.weight_version,
                run,
            )

    def announced(self, version: int | None) -> None:
        """The run's trainer serves ``version`` now (its engines have it): engines attached
        from now on that do not are held; the held ones are read again (one may have just
        received it). A run's first announce reads every engine attached before it (what it
        serves may have changed since its attach). ``None``: the trainer left; with no run, no
        engine is held."""
        first, self.run_version = self.run_version is None, version
        if version is None:
            for engine in self.engines.values():
                engine.held = False
            return
        if first:
            for engine in self.engines.values():
                engine.held = True
        if any(e.held for e in self.engines.values()):
            task = asyncio.create_task(self.recheck(), name="areal-engine-recheck")
            self._rechecks.add(task)
            task.add_done_callback(self._rechecks.discard)

    async def recheck(self) -> None:
        """Read the ``/model_info`` of every held engine: one that now serves the run's version
        takes traffic. One that does not answer stays held (the health checks take it out if it
        keeps not answering)."""
        held = [e for e in self.engines.values() if e.held and not e.detached]
        answers = await asyncio.gather(
            *(asyncio.wait_for(e.client.model_info(), self.health_timeout) for e in held),
            return_exceptions=True,
        )
        for engine, info in zip(held, answers, strict=True):
            if isinstance(info, BaseException) or not engine.held:
                continue
            label = info.get("weight_version")
            engine.weight_version = None if label is None else str(label)
            if self.run_version is None or version_number(label) == self.run_version:
                log.info(
                    "engine %s serves the run's version %s: it takes traffic", engine.url, label
                )
                engine.held = False

    def get(self, url: str) -> Engine | None:
        return self.engines.get(normalize_url(url))

    async def detach(
        self, url: str, *, drain: bool = False, timeout: float = 30.0
    ) -> dict[str, Any]:
        """Take the engine out: no new calls; with ``drain`` its running calls may finish for
        up to ``timeout`` seconds, the rest (or all, without ``drain``) are cancelled."""
        engine = self.engines.get(normalize_url(url))
        if engine is None:
            raise GatewayError(
                404,
                f"no engine is attached at {url}; GET /rl/engines lists them",
                param="url",
                code="engine_not_found",
            )
        engine.draining = True
        running = [c for c in engine.calls if not c.done()]
        finished = 0
        if drain and running:
            done, _ = await asyncio.wait(running, timeout=timeout)
            finished = len(done)
        del self.engines[engine.url]
        engine.detached = True
        aborted = engine.cancel_calls("was detached")
        await engine.client.aclose()
        log.info(
            "engine %s detached: %d calls finished, %d aborted; %d attached",
            engine.url,
            finished,
            aborted,
            len(self),
        )
        return {"detached": engine.url, "finished": finished, "aborted": aborted}

    def __len__(self) -> int:
        return len(self.engines)

    @property
    def urls(self) -> list[str]:
        return list(self.engines)

    def live(self) -> list[Engine]:
        return [e for e in self.engines.values() if e.live]

    def describe(self) -> list[dict[str, Any]]:
        return [e.describe() for e in self.engines.values()]

    # --- choosing and tracking calls ----------------------------------------------------------

    def pick(self, sticky: str | None = None, *, avoid: set[str] | None = None) -> Engine:
        """A live engine: the same one for the same ``sticky`` key while the pool is unchanged
        (a conversation keeps its KV-cached prefix), else one running the fewest calls (in turn
        among equals). Fewest calls, not plain turns: an engine attached to a busy pool gets the
        new calls until it carries its share, instead of the old engines' backlog taking
        minutes to even out, and a faster engine gets more."""
        live = [e for e in self.live() if not avoid or e.url not in avoid]
        if not live:
            raise self.unavailable(tried=bool(avoid))
        live = [e for e in live if not e.held] or live  # held ones: only when nothing else
        if sticky is not None and len(live) > 1:
            return live[zlib.crc32(sticky.encode()) % len(live)]
        turn = next(self._turn)
        least = min(len(e.calls) for e in live)
        idle = [e for e in live if len(e.calls) == least]
        return idle[turn % len(idle)]

    def unavailable(self, *, tried: bool = False) -> GatewayError:
        headers = {"Retry-After": str(RETRY_AFTER_S)}
        if not self.engines:
            return GatewayError(
                503,
                "no policy engine is attached to this gateway yet: attach one with POST "
                '/rl/engines {"url": ...} (admin token), or start `areal serve inference '
                f"--model DIR --attach GATEWAY_URL`; retry after {RETRY_AFTER_S}s",
                code="no_engine",
                headers=headers,
            )
        what = "answering" if not tried else "left to retry this call on"
        return GatewayError(
            503,
            f"no policy engine is {what} ({len(self)} attached: "
            f"{', '.join(self._states())}); retry after {RETRY_AFTER_S}s",
            code="no_engine",
            headers=headers,
        )

    def _states(self) -> list[str]:
        return [
            f"{e.url} {'draining' if e.draining else 'down' if not e.healthy else 'busy'}"
            for e in self.engines.values()
        ]

    async def call(self, engine: Engine, work: Awaitable[T]) -> T:
        """Run ``work`` on ``engine``, tracked: if the engine leaves meanwhile, :class:`EngineLost`."""
        group = CALL_GROUP.get()
        if group is not None and group.cut_why is not None:  # its session ended meanwhile
            if asyncio.iscoroutine(work):
                work.close()  # never to be awaited
            raise group.error()
        future = asyncio.ensure_future(work)
        engine.calls.add(future)
        if group is not None:
            group.calls.add(future)
        try:
            result = await future
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if future.cancelled() and not (current and current.cancelling()):
                raise self._lost(engine, group) from None
            raise
        finally:
            engine.calls.discard(future)
            if group is not None:
                group.calls.discard(future)
        engine.served += 1
        return result

    async def stream(self, engine: Engine, items: AsyncIterator[T]) -> AsyncIterator[T]:
        """``items`` (an engine's stream), tracked as one call for its whole length: it counts
        as running, a drain waits for it, and when the engine leaves, a read in progress is
        interrupted (or the next one refused) with :class:`EngineLost`.

        Why not :meth:`call` per item: a task per stream chunk cost more of the gateway's CPU
        than the chunk itself. One future stands for the stream in ``engine.calls``; cancelling
        it (``cancel_calls``) cancels the task reading, only while it is reading."""
        iterator = aiter(items)
        reader = _StreamReader(asyncio.get_running_loop().create_future())
        engine.calls.add(reader.call)
        group = CALL_GROUP.get()
        if group is not None:
            group.calls.add(reader.call)
            if group.cut_why is not None:  # its session ended meanwhile: no generation starts
                reader.call.cancel()
        try:
            while True:
                if reader.call.cancelled():
                    raise self._lost(engine, group)
                reader.task = asyncio.current_task()  # the consumer may read each in a new task
                reader.reading = True
                try:
                    item = await anext(iterator)
                except StopAsyncIteration:
                    return
                except asyncio.CancelledError:
                    if reader.lost():
                        raise self._lost(engine, group) from None
                    raise
                finally:
                    reader.reading = False
                yield item
        finally:
            engine.calls.discard(reader.call)
            if group is not None:
                group.calls.discard(reader.call)
            if not reader.call.done():
                reader.call.set_result(None)
                engine.served += 1
            closer = getattr(iterator, "aclose", None)
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer()

    @staticmethod
    def _lost(engine: Engine, group: CallGroup | None) -> GatewayError:
        """Why a call was cancelled: its session ended (cut), else its engine left."""
        if group is not None and group.cut_why is not None:
            return group.error()
        return EngineLost(engine.url, engine.lost_why or "went away")

    def mark_down(self, engine: Engine, why: str) -> None:
        """No traffic to ``engine`` until it answers a health check again; its calls are lost."""
        if engine.healthy:
            log.warning(
                "engine %s is down (%s): no traffic until it answers again", engine.url, why
            )
        engine.healthy = False
        engine.failures = max(engine.failures, self.down_after)
        engine.cancel_calls("went down")

    # --- health ------------------------------------------------------------------------------

    def start(self) -> None:
        if self._health is None and self.health_every > 0:
            self._health = asyncio.create_task(self._watch(), name="areal-engine-health")

    async def close(self) -> None:
        for task in list(self._rechecks):
            task.cancel()
        if self._health is not None:
            self._health.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health
            self._health = None
        for engine in list(self.engines.values()):
            await engine.client.aclose()

    async def check_health(self) -> None:
        """One round of health checks over every attached engine."""
        engines = list(self.engines.values())
        answers = await asyncio.gather(
            *(e.client.health(timeout=self.health_timeout) for e in engines),
            return_exceptions=True,
        )
        for engine, ok in zip(engines, answers, strict=True):
            if engine.detached:
                continue
            if ok is True:
                if not engine.healthy:
                    log.info("engine %s answers again: back in service", engine.url)
                engine.healthy, engine.failures = True, 0
                continue
            engine.failures += 1
            if engine.failures >= self.down_after and engine.healthy:
                self.mark_down(engine, f"{engine.failures} failed health checks")
        if any(e.held for e in self.engines.values()):
            await self.recheck()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.health_every)
            try:
                await self.check_health()
            except Exception:  # keep watching: one bad round must not stop the checks
                log.exception("the engine health check failed; it goes on")


def normalize_url(url: str) -> str:
    return url.strip().rstrip("/")


def note_lost(url: str) -> None:
    """Remember, for the request being served, that it lost a call half-way on ``url``."""
    box = LOST_CALLS.get()
    if box is not None:
        box.append(url)
