"""Rollout workers: run an unmodified agent once per task sample, each in its own gateway session.

The worker is the RL driver of the gateway's session API (``areal.gateway.sessions``, through
:class:`~areal.run.gateway_client.GatewayAdmin`). For every
sample of every task it opens a session with the admin token (waiting out ``429`` + ``Retry-After``
while the staleness budget is full), hands the agent the gateway's ``/v1`` URL and the session's
fresh key, runs it under a per-episode timeout, and ends the session with the episode's reward, so
the gateway turns what the agent generated into a trajectory for the trainer.

The agent contract (:data:`AgentFn`): ``agent(episode)``, sync or async, returns

- a ``float``: the episode's reward, used as is;
- a ``str``: the final answer, scored by ``reward_fn(completion=..., task=...)`` (required then);
- ``None``: no reward (the agent may have set per-turn rewards itself through the session API).

Failures never block the run: an agent that raises or runs past ``episode_timeout_s`` is cancelled,
its session ended with ``{"discard": true}`` and counted (``failed`` / ``timed_out``, with the
exception type in ``errors``). Discarding rather than rewarding 0 keeps crashes out of the
gradient (a crash says nothing about the policy) and gives the budget slot back at once, so the
trainer never waits for them. Errors of the session API itself (the gateway is down, the budget
stays full past ``max_wait_s``) are not the agent's fault and stop the run with :class:`RolloutError`.
Neither does an agent that never works: when the first ``GIVE_UP_AFTER`` episodes all failed and
none finished, the worker stops with :class:`AgentBroken`, naming the error.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from areal.core.episode import AgentFn, Episode
from areal.core.rewards import RewardFn
from areal.host.faults import crash_point
from areal.run.gateway_client import (
    GatewayAdmin,
    GatewayAdminError,
    GatewayBusy,
    GatewayRefused,
    GatewayUnreachable,
    OpenedSession,
    SessionSummary,
)

log = logging.getLogger("areal.rollout")
LONG_POLL_S = 10.0  # how long one session request may wait at the gateway for a free slot


GIVE_UP_AFTER = 32  # a worker whose first this-many episodes all failed stops (AgentBroken)


class RolloutError(RuntimeError):
    """The session API failed (not the agent): the run cannot go on."""


class AgentBroken(RolloutError):
    """Every episode so far failed and none finished: the agent cannot run here (an import
    error, a missing key, a bug), which no amount of training fixes. The worker stops with the
    error instead of discarding episodes forever while the trainer waits. HTTP and network
    errors do not count: an engine restarting makes every episode fail for a while."""


_WIRE_MODULES = ("openai", "anthropic", "httpx", "httpcore", "aiohttp", "requests", "urllib3")


def _wire_error(err: BaseException) -> bool:
    """Did the agent fail talking to the gateway (an SDK's API error, a connection error)?"""
    if isinstance(err, (OSError, TimeoutError)):
        return True
    return any(cls.__module__.split(".")[0] in _WIRE_MODULES for cls in type(err).__mro__)


@dataclass
class RolloutStats:
    """Counts of one :meth:`RolloutWorker.run`;
    ``finished + failed + timed_out + cut == started``."""

    started: int = 0
    finished: int = 0  # the agent returned and its session was ended with its reward
    sent: int = 0  # of those, trajectories the gateway handed to the trainer (non-empty)
    failed: int = 0  # the agent (or the reward function) raised
    timed_out: int = 0
    # The gateway ended the session before the worker did: the trainer trained its group without
    # it, it grew too stale to train, or it sat idle. Nothing of it is trained; not a failure.
    cut: int = 0
    broken: int = 0  # of the failures, those that were not an HTTP or network error
    rewards: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    waited_s: float = 0.0  # time spent waiting out 429s
    seconds: float = 0.0

    @property
    def mean_reward(self) -> float | None:
        return sum(self.rewards) / len(self.rewards) if self.rewards else None

    def to_json(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "finished": self.finished,
            "sent": self.sent,
            "failed": self.failed,
            "timed_out": self.timed_out,
            "cut": self.cut,
            "broken": self.broken,
            "mean_reward": self.mean_reward,
            "errors": dict(self.errors),
            "waited_s": round(self.waited_s, 3),
            "seconds": round(self.seconds, 3),
        }


class RolloutWorker:
    """Runs ``agent`` over tasks through the gateway at ``gateway_url`` (without ``/v1``).

    ``concurrency`` bounds the episodes in flight; ``max_wait_s`` bounds how long opening one
    session may wait out ``429`` answers before the run stops with :class:`RolloutError`.
    """

    def __init__(
        self,
        gateway_url: str,
        admin_token: str,
        agent: AgentFn,
        *,
        reward_fn: RewardFn | None = None,
        concurrency: int = 8,
        episode_timeout_s: float = 600.0,
        max_turns: int = 8,
        model: str = "default",
        max_wait_s: float = 600.0,
        request_timeout_s: float = 60.0,
        metadata: Mapping[str, Any] | None = None,
        session_fields: Mapping[str, Any] | None = None,
        train: bool = True,
        gateway_log: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if episode_timeout_s <= 0:
            raise ValueError(f"episode_timeout_s must be > 0, got {episode_timeout_s}")
        self.gateway_url = gateway_url.rstrip("/")
        self.admin_token = admin_token
        self.clock = clock  # the wait for a free slot is measured on it (tests pass a fake)
        self.sleep = sleep
        self.agent = agent
        self.reward_fn = reward_fn
        self.concurrency = concurrency
        self.episode_timeout_s = episode_timeout_s
        self.max_turns = max_turns
        self.model = model
        self.max_wait_s = max_wait_s
        self.request_timeout_s = request_timeout_s
        self.metadata = dict(metadata or {})  # added to every session's metadata
        self.session_fields = dict(session_fields or {})  # e.g. {"api_key": fixed key}
        self.train = train  # False: sessions end discarded, nothing reaches the trainer
        self.gateway_log = gateway_log  # named when the gateway cannot be reached
        self.last_stats: RolloutStats | None = None  # the counters of the current/last run

    async def run(
        self,
        tasks: AsyncIterable[Mapping[str, Any]] | Iterable[Mapping[str, Any]],
        *,
        n_samples_per_task: int = 1,
    ) -> RolloutStats:
        """Run every sample of every task; returns when all have ended (or a session call fails).

        Tasks are read lazily, so an endless stream works: at most ``concurrency`` episodes are in
        flight. A task's ``task_id`` (else ``id``, else its position) and a group id go into each
        session's metadata, hence into its trajectory, with ``group_size`` (the trainer trains
        a group whole once every member has arrived or is known lost). The group id is
        ``task-{task_index}`` for tasks of a run's indexed stream (stable across restarts and
        resumes), else unique to this call.
        """
        if n_samples_per_task < 1:
            raise ValueError(f"n_samples_per_task must be >= 1, got {n_samples_per_task}")
        stats = self.last_stats = RolloutStats()
        start = time.monotonic()
        slots = asyncio.Semaphore(self.concurrency)
        pending: set[asyncio.Task[None]] = set()
        fatal: list[BaseException] = []
        run_id = secrets.token_hex(4)

        def done(task: asyncio.Task[None]) -> None:
            slots.release()
            pending.discard(task)
            error = None if task.cancelled() else task.exception()
            if error is not None:
                fatal.append(error)

        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            admin = GatewayAdmin(self.gateway_url, self.admin_token, http=http)
            try:
                index = 0
                async for task in _aiter(tasks):
                    task_id = task.get("task_id", task.get("id", index))
                    task_index = task.get("task_index")
                    group = f"task-{task_index}" if task_index is not None else f"{run_id}-{index}"
                    for sample in range(n_samples_per_task):
                        await slots.acquire()
                        if fatal:
                            slots.release()
                            raise fatal[0]
                        ep = self._episode(
                            admin, stats, task, task_id, group, sample, n_samples_per_task
                        )
                        job = asyncio.create_task(ep)
                        pending.add(job)
                        job.add_done_callback(done)
                    index += 1
                while pending and not fatal:
                    await asyncio.wait(set(pending), return_when=asyncio.FIRST_COMPLETED)
                if fatal:
                    raise fatal[0]
            finally:
                for job in list(pending):
                    job.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                stats.seconds = time.monotonic() - start
        return stats

    # --- one episode ----------------------------------------------------------------------------

    async def _episode(
        self,
        admin: GatewayAdmin,
        stats: RolloutStats,
        task: Mapping[str, Any],
        task_id: Any,
        group: str,
        sample: int,
        group_size: int = 1,
    ) -> None:
        metadata = {
            **self.metadata,
            "task_id": task_id,
            "group": group,
            "group_size": group_size,
            "sample": sample,
        }
        if "task_index" in task:
            metadata["task_index"] = task["task_index"]
        opened = await self._open(
            admin, stats, {**self.session_fields, "metadata": metadata, "task_id": task_id}
        )
        sid = opened["session_id"]
        episode = Episode(
            task=task,
            base_url=self.gateway_url + "/v1",
            api_key=opened["api_key"],
            model=self.model,
            max_turns=self.max_turns,
            session_id=sid,
            task_id=task_id,
            group=group,
            sample=sample,
        )
        stats.started += 1
        crash_point("rollout.episode_open")  # open at the gateway: a test may hold it here
        try:
            reward = await asyncio.wait_for(self._play(episode), self.episode_timeout_s)
        except asyncio.CancelledError:
            await asyncio.shield(self._discard(admin, sid))
            raise
        except TimeoutError:
            stats.timed_out += 1
            stats.errors["TimeoutError"] += 1
            log.warning(
                "episode %s (task %r) timed out after %ss (the worker's episode_timeout_s)",
                sid,
                task_id,
                self.episode_timeout_s,
            )
            await self._before_end(admin, episode)
            await self._discard(admin, sid)
            return
        except Exception as err:
            await self._before_end(admin, episode)
            if not await self._discard(admin, sid):  # its calls failed because it had ended
                stats.cut += 1
                log.info("episode %s (task %r) was ended by the gateway: %r", sid, task_id, err)
                return
            stats.failed += 1
            stats.errors[type(err).__name__] += 1
            log.warning("episode %s (task %r) failed: %r", sid, task_id, err)
            stats.broken += not _wire_error(err)
            if stats.finished == 0 and stats.broken >= GIVE_UP_AFTER:
                raise AgentBroken(
                    f"the agent failed in all of its first {stats.failed} episodes and finished "
                    f"none (last error: {err!r}; errors: {dict(stats.errors)}): the agent or its "
                    "environment is broken, not the policy; fix it and run again"
                ) from err
            return
        await self._before_end(admin, episode)
        end = admin.end(sid, reward=reward) if self.train else admin.end(sid, discard=True)
        ended = await self._end(end)
        if ended is None:
            stats.cut += 1
            log.info("episode %s (task %r) was ended by the gateway first", sid, task_id)
            return
        stats.finished += 1
        stats.sent += bool(ended.get("sent"))
        if reward is not None:
            stats.rewards.append(reward)

    async def _before_end(self, admin: GatewayAdmin, episode: Episode) -> None:
        """Called while the episode's session is still open, whatever the outcome (a probe
        reads the session's trace here)."""

    async def _play(self, episode: Episode) -> float | None:
        """Run the agent and turn what it returns into the episode's reward."""
        return await self._reward(await self._run_agent(episode), episode)

    async def _run_agent(self, episode: Episode) -> Any:
        out = self.agent(episode)
        return await out if inspect.isawaitable(out) else out

    async def _reward(self, out: Any, episode: Episode) -> float | None:
        """The agent's result as a reward: a number as is, an answer scored by ``reward_fn``."""
        if out is None:
            return None
        if isinstance(out, str):
            if self.reward_fn is None:
                raise TypeError("the agent returned an answer but the worker has no reward_fn")
            scored = self.reward_fn(completion=out, task=episode.task)
            out = await scored if inspect.isawaitable(scored) else scored
        if isinstance(out, bool) or not isinstance(out, int | float) or not math.isfinite(out):
            raise TypeError(f"a reward must be a finite number, got {out!r}")
        return float(out)

    # --- the session API ------------------------------------------------------------------------

    async def _open(
        self, admin: GatewayAdmin, stats: RolloutStats, fields: dict[str, Any]
    ) -> OpenedSession:
        """Open a session, waiting out ``429`` + ``Retry-After`` for at most ``max_wait_s``."""
        waited = 0.0
        while True:
            # Long poll: the gateway holds the request until a slot frees (or wait_s passes).
            window = max(
                0.0, min(LONG_POLL_S, self.max_wait_s - waited, self.request_timeout_s / 2)
            )
            started = self.clock()
            try:
                return await admin.open_session(**fields, wait_s=window)
            except GatewayBusy as busy:
                full = busy
            except GatewayAdminError as err:
                raise self._failure(err) from err
            finally:
                held = self.clock() - started  # a long poll's wait counts as waiting
                waited += held
                stats.waited_s += held
            # the gateway held it the whole time: ask again at once
            wait = 0.0 if window and held >= 0.9 * window else full.retry_after
            if waited + wait > self.max_wait_s:
                raise RolloutError(
                    f"the gateway's staleness budget stayed full for {waited:.1f}s "
                    f"(max_wait_s={self.max_wait_s}); is the trainer consuming trajectories? "
                    f"last answer: {full.reason}"
                )
            await self.sleep(wait)
            waited += wait
            stats.waited_s += wait

    async def _discard(self, admin: GatewayAdmin, sid: str) -> bool:
        """End the episode as discarded; False if the gateway already had."""
        return await self._end(admin.end(sid, discard=True)) is not None

    async def _end(self, call: Awaitable[SessionSummary]) -> SessionSummary | None:
        """The answer of ending a session; ``None`` if the gateway had ended it first (a turn
        refused as too stale, a group trained without it: ``409 session_ended`` is that, not a
        failure). Any other failure stops the run (:class:`RolloutError`)."""
        try:
            return await call
        except GatewayRefused as err:
            if err.code != "session_ended":
                raise self._failure(err) from err
            return None
        except GatewayAdminError as err:
            raise self._failure(err) from err

    def _failure(self, err: GatewayAdminError) -> RolloutError:
        """``err`` as the run's error; an unreachable gateway says why (nothing listens, ...)."""
        if not isinstance(err, GatewayUnreachable):
            return RolloutError(str(err))
        from areal.run.reachability import describe_unreachable

        why = describe_unreachable(self.gateway_url, log_path=self.gateway_log)
        return RolloutError(
            f"cannot reach the gateway at {self.gateway_url} ({type(err.cause).__name__}): {why}"
        )


async def _aiter(
    items: AsyncIterable[Mapping[str, Any]] | Iterable[Mapping[str, Any]],
) -> AsyncIterable[Mapping[str, Any]]:
    if isinstance(items, AsyncIterable):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item
