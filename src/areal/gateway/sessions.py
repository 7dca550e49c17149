"""RL sessions: episode keys, the session API, and recording completions into trajectories.

An RL driver (the trainer's rollout worker, or a script) opens a session with the admin token
(``AREAL_ADMIN_TOKEN``) and hands the returned key to an unmodified agent as its API key. Every
policy call made with that key is served as usual and recorded token for token (prompt ids as the
gateway rendered them; output ids, log-probs and versions as the engine generated them). The driver
then sets rewards and ends the session; ``end`` turns the completions into a
:class:`~areal.core.types.Trajectory` and hands it to the trajectory sink.

Routes, under ``/rl`` and ``/gateway/rl`` (served by :mod:`areal.gateway.session_api`; this module
keeps the state and knows nothing of requests):

- ``POST /rl/sessions`` (admin) ``{"metadata": {...}, "task_id": ..., "hint": ...,
  "api_key": optional fixed key, "wait_s": optional long poll}`` -> ``{"session_id", "api_key"}``;
  ``429`` + ``Retry-After`` when the staleness budget is full (or another open session holds the
  fixed key) and stays so for ``wait_s`` seconds.
- ``POST /rl/sessions/{id}/reward`` ``{"reward": float, "completion_id": optional}``: a turn's
  reward, or the episode's when no completion is named (the last value set wins).
- ``POST /rl/sessions/{id}/end`` ``{"reward": optional float, "discard": optional bool}``.
- ``GET /rl/sessions/{id}``: status. ``GET /rl/sessions`` (admin): open sessions and the budget.
- ``GET /rl/sessions/{id}/trace`` (:mod:`areal.gateway.trace`): the calls and how the turns
  merged, for ``areal probe``.

The routes a training run adds (the version clock, discarding by metadata) and the idle reaper
live in :mod:`areal.gateway.rl_control`; a session is *active* while a call made with its key
runs, and it was last active when such a call, a recorded completion or a reward last happened.

The per-session routes take the admin token or that session's own key; a session key stops
working (``401``) once its session ends. Only finished, non-aborted generations are recorded: an
aborted one was cut short by the engine (a client disconnect or an abort request), the client
never got a complete answer, so it is counted in the status but not trained on; if the agent goes
on with the partial text, the next turn's prompt carries it as context. Records that arrive after
``end`` are dropped. Everything runs on the gateway's event loop and changes state between awaits,
so no locks are needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from areal.core.episode_journal import ACCEPT, REJECT, START, EpisodeJournal
from areal.core.queue import TrajectorySink
from areal.core.staleness import StalenessBudget
from areal.core.trajectory import build_trajectory
from areal.core.types import Completion, Trajectory
from areal.gateway.engine_pool import CallGroup
from areal.gateway.errors import GatewayError
from areal.gateway.policy import Generation
from areal.gateway.reaper_rounds import LoopClock
from areal.host.faults import crash_point

log = logging.getLogger("areal.gateway.sessions")

ENDED_KEPT = 4096  # ended sessions whose status can still be asked for
CALLS_KEPT = 256  # calls remembered per session (for probes; the access log has them all)
FALLBACK_POLL_S = 0.25  # a long poll's check for changes nobody announced


@dataclass
class Session:
    """One episode: its key, what the driver said about it, and the completions recorded so far."""

    session_id: str
    api_key: str = field(repr=False)
    metadata: dict[str, Any] = field(default_factory=dict)
    task_id: Any = None
    hint: str | None = None
    created: float = field(default_factory=time.time)
    completions: list[Completion] = field(default_factory=list, repr=False)
    reward: float | None = None
    aborted: int = 0
    ended_at: float | None = None
    summary: dict[str, Any] | None = None
    busy: int = field(default=0, repr=False)  # calls with this session's key still running
    oldest_version: int | None = None  # of its generated tokens (the staleness that counts)
    lost_calls: int = (
        0  # calls whose engine left half-way (engine_pool): the episode is not trained
    )
    calls: list[dict[str, Any]] = field(default_factory=list, repr=False)  # see note_call
    # The engine calls its key's requests are running: cut when it ends (engine_pool.CallGroup).
    engine_calls: CallGroup = field(default_factory=CallGroup, repr=False)
    # Who ends it when idle instead of the session reaper: "online" conversations (areal.gateway.
    # online) wait for their reward after the agent goes quiet, which the reaper would cut short.
    owner: str | None = None
    # What its silence is measured on: its manager's LoopClock (areal.gateway.reaper_rounds).
    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)
    last_active: float = field(init=False, repr=False)  # on ``clock``

    def __post_init__(self) -> None:
        self.last_active = self.clock()

    def note_call(self, **call: Any) -> None:
        """Remember one API call made for this episode (path, model asked for, status), so a
        probe can tell "the agent never called" from "it called and was refused"."""
        if len(self.calls) < CALLS_KEPT:
            self.calls.append(call)

    def touch(self) -> None:
        self.last_active = self.clock()

    def idle_for(self, now: float) -> float:
        """Seconds of ``clock`` since the last activity; 0 while a call with its key runs."""
        return 0.0 if self.busy else now - self.last_active

    @property
    def is_open(self) -> bool:
        return self.ended_at is None

    def completion(self, completion_id: str) -> Completion | None:
        return next((c for c in self.completions if c.completion_id == completion_id), None)

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "session_id": self.session_id,
            "status": "open" if self.is_open else "ended",
            "task_id": self.task_id,
            "metadata": self.metadata,
            "created": self.created,
            "ended": self.ended_at,
            "reward": self.reward,
            "aborted": self.aborted,
        }
        if self.is_open:
            out["completions"] = len(self.completions)
            out["turn_rewards"] = {
                c.completion_id: c.reward for c in self.completions if c.reward is not None
            }
        else:
            out.update(self.summary or {})
        return out


class SessionManager:
    """Owns the sessions of this gateway; ``lookup`` maps a key to its open session.

    ``sink`` receives finished trajectories (``None``: they are dropped, with a warning);
    ``discount`` carries the episode reward back over earlier samples; ``budget`` is the staleness
    budget new sessions must fit in (default: unbounded); ``idle_timeout`` (seconds, ``None``:
    never) is how long an open session may go without activity before ``expire_idle`` ends it;
    ``journal`` records each admission and its outcome (:mod:`areal.core.episode_journal`);
    ``clock`` (injectable for tests) is what ``loop_clock``, the sessions' silence, follows.
    """

    def __init__(
        self,
        admin_token: str | None,
        *,
        sink: TrajectorySink | None = None,
        discount: float = 1.0,
        budget: StalenessBudget | None = None,
        idle_timeout: float | None = None,
        journal: EpisodeJournal | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0.0 <= discount <= 1.0:
            raise ValueError(f"the reward discount must be within [0, 1], got {discount}")
        if idle_timeout is not None and idle_timeout <= 0:
            raise ValueError(f"the session idle timeout must be > 0 (or None), got {idle_timeout}")
        self.admin_token = admin_token
        self.sink = sink
        self.discount = discount
        self.budget = budget or StalenessBudget()
        self.idle_timeout = idle_timeout
        self.expired = 0  # sessions ended by expire_idle
        self.discarded = 0  # sessions ended by discard_matching
        self.refused_stale = 0  # sessions ended by refuse_if_stale
        self.delivering = 0  # trajectories handed to the sink, not yet acknowledged
        self.waiting = 0  # long polls held now, waiting for a slot (open_waiting)
        self.journal = journal or EpisodeJournal(None)
        self.loop_clock = LoopClock(clock)  # its reaper's rounds (rl_control.IdleReaper) drive it
        self._by_key: dict[str, Session] = {}
        self._by_id: dict[str, Session] = {}
        self._by_hint: dict[str, Session] = {}
        self._ended: OrderedDict[str, Session] = OrderedDict()
        self._changed = asyncio.Event()  # set (and replaced) by capacity_changed
        self._admitting = True  # False from the server's shutdown (or close) on: no new episodes
        self._closed = False

    # --- used by the app ------------------------------------------------------------------------

    def lookup(self, api_key: str) -> Session | None:
        return self._by_key.get(api_key)

    def hint(self, session_hint: str) -> Session | None:
        """The open session a client's own grouping hint was bound to (``hint`` at creation)."""
        return self._by_hint.get(session_hint)

    async def record(self, session: Session, *, model: str, generation: Generation) -> str | None:
        """Record one finished completion of ``session``; returns its completion id.

        ``None`` when nothing was recorded: the session has ended, or the generation is not
        finished or was aborted (see the module docstring).
        """
        if not session.is_open:
            log.info("session %s has ended; a late completion is not recorded", session.session_id)
            return None
        session.touch()
        if not generation.finished or generation.finish_reason == "abort":
            session.aborted += 1
            return None
        n = len(generation.output_ids)
        if not len(generation.logprobs) == len(generation.versions) == n:
            raise GatewayError(
                502,
                f"the engine at {generation.engine} returned {n} output tokens but "
                f"{len(generation.logprobs)} log-probs and {len(generation.versions)} versions; "
                "the completion cannot be recorded",
            )
        completion = Completion(
            completion_id="cmpl-" + secrets.token_hex(12),
            session_id=session.session_id,
            turn=len(session.completions),
            model=model,
            prompt_ids=list(generation.prompt_ids),
            output_ids=list(generation.output_ids),
            output_logprobs=list(generation.logprobs),
            output_versions=list(generation.versions),
            finish_reason=generation.finish_reason or "stop",
            sampling=dict(generation.sampling),
        )
        session.completions.append(completion)
        known = [v for v in generation.versions if v >= 0]
        if known and (session.oldest_version is None or min(known) < session.oldest_version):
            session.oldest_version = min(known)
        if generation.versions:  # the engines' weights show how far the trainer has got
            self.budget.set_version(max(generation.versions))
            self.capacity_changed()
        return completion.completion_id

    def stop_admitting(self) -> None:
        """No new episodes from now on; the long polls waiting for a slot answer 503 at once.

        Called when the server starts shutting down, before it waits for the requests in flight:
        a rollout worker's long poll would otherwise hold the shutdown for its whole wait (10 s by
        default), although no episode it could open would ever be trained. The open sessions
        carry on until :meth:`close`."""
        self._admitting = False
        self.capacity_changed()

    async def close(self) -> None:
        """Drop the sessions still open (an unfinished episode is not trained on) and close the
        sink, which flushes and syncs what it holds."""
        if self._closed:
            return
        self._closed = True
        self.stop_admitting()
        for session in list(self._by_id.values()):
            if session.is_open:
                self._retire(session)
                self._finish(session, accepted=False)
        if self.sink is not None:
            await self.sink.close()
        self.journal.close()

    # --- the session life cycle, callable without HTTP ------------------------------------------

    def open(
        self,
        *,
        metadata: dict[str, Any] | None = None,
        task_id: Any = None,
        hint: str | None = None,
        api_key: str | None = None,
        owner: str | None = None,
    ) -> Session:
        """Start an episode if the staleness budget has room (else a 429 with Retry-After).

        ``api_key``: a key chosen by the driver instead of a fresh one, for agents that keep one
        key per install (OpenClaw in some setups). Each session holding it is one episode; while
        one is open, opening another with the same key answers 429, so such episodes run one at
        a time per key. ``owner``: see :attr:`Session.owner`.
        """
        if not self._admitting:
            raise GatewayError(503, "the gateway is shutting down; no new sessions")
        if api_key is not None and api_key in self._by_key:
            raise GatewayError(
                429,
                "a session holding this fixed key is still open (one episode at a time per "
                "fixed key); retry after 1s",
                code="session_key_busy",
                headers={"Retry-After": "1"},
            )
        if not self.budget.try_start():
            snap = self.budget.snapshot()
            wait = max(1, math.ceil(self.budget.retry_after_s))
            raise GatewayError(
                429,
                f"no capacity under the staleness budget (version {snap.version}, "
                f"{snap.accepted} accepted, {snap.running} running); retry after {wait}s",
                code="staleness_budget_full",
                headers={"Retry-After": str(wait)},
            )
        session = Session(
            session_id="s_" + secrets.token_hex(8),
            api_key=api_key or "areal-session-" + secrets.token_urlsafe(32),
            metadata=dict(metadata or {}),
            task_id=task_id,
            hint=hint,
            owner=owner,
            clock=self.loop_clock,
        )
        self.journal.note(START, session.session_id)
        self._by_id[session.session_id] = session
        self._by_key[session.api_key] = session
        if hint:
            self._by_hint[hint] = session
        return session

    async def open_waiting(
        self, wait_s: float, *, gone: Callable[[], bool] = lambda: False, **fields: Any
    ) -> Session:
        """:meth:`open`, holding the request up to ``wait_s`` seconds while the answer would be
        429 (budget full, fixed key busy): a long poll. A waiter tries again when a slot may have
        freed (:meth:`capacity_changed`: an episode ended, the version moved), so a rollout worker
        starts its episode right then, where waiting out ``Retry-After`` (whole seconds) cost a
        synchronous run ~7 % of its throughput; ``FALLBACK_POLL_S`` covers changes made around
        this manager (a budget moved directly).

        ``gone`` says whether the client has hung up: a waiter whose worker died gives up
        instead of opening a session nobody will drive (it would hold a budget slot until the
        idle timeout, and a restarted worker's discard of its predecessor's sessions comes
        before it: a run once stalled on four such sessions)."""
        deadline = time.monotonic() + wait_s
        while True:
            changed = self._changed
            if gone():
                raise GatewayError(
                    499, "the client closed its connection before a session opened", code="gone"
                )
            try:
                return self.open(**fields)
            except GatewayError as err:
                left = deadline - time.monotonic()
                if err.status != 429 or left <= 0:
                    raise
            self.waiting += 1
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), min(left, FALLBACK_POLL_S))
            finally:
                self.waiting -= 1

    def capacity_changed(self) -> None:
        """Wake the long polls: a slot or a fixed key may be free now."""
        self._changed.set()
        self._changed = asyncio.Event()

    def set_reward(
        self, session: Session, reward: float, completion_id: str | None = None
    ) -> Completion | None:
        """A turn's reward (``completion_id``) or the episode's; the last value set wins."""
        if not session.is_open:
            raise GatewayError(409, f"session {session.session_id} has ended", code="session_ended")
        session.touch()
        if completion_id is None:
            session.reward = reward
            return None
        completion = session.completion(completion_id)
        if completion is None:
            raise GatewayError(
                404,
                f"session {session.session_id} has no completion {completion_id!r}",
                param="completion_id",
                code="completion_not_found",
            )
        completion.reward = reward
        return completion

    async def end(self, session: Session, *, discard: bool = False) -> dict[str, Any]:
        """Close ``session``: its key stops working, its trajectory goes to the sink.

        A discarded or empty episode goes nowhere and gives its budget slot back unused.
        """
        if not session.is_open:
            raise GatewayError(409, f"session {session.session_id} has ended", code="session_ended")
        self._retire(session)  # from here on, late records and rewards are refused
        cut = session.engine_calls.cut(
            f"session {session.session_id} ended while this call was generating: nothing more "
            "of its episode is trained (its group was trained without it, it grew too stale, or "
            "its driver discarded it)"
        )
        if cut:
            log.info("session %s ended: %d running engine call(s) cut", session.session_id, cut)
        if session.lost_calls and not discard:
            log.info(
                "session %s lost %d call(s) with an engine that left: discarded, not trained",
                session.session_id,
                session.lost_calls,
            )
            discard = True
        trajectory = build_trajectory(
            session.session_id,
            session.completions,
            episode_reward=session.reward,
            discount=self.discount,
            metadata={**session.metadata, "task_id": session.task_id},
        )
        send = not discard and bool(trajectory.samples) and self.sink is not None
        if not discard and trajectory.samples and self.sink is None:
            log.warning("no trajectory sink: episode %s is dropped", session.session_id)
        try:
            if send:
                assert self.sink is not None
                self.delivering += 1
                try:
                    crash_point("gateway.handing_over")
                    await self.sink.put(trajectory)
                    crash_point("gateway.handed_over")
                finally:
                    self.delivering -= 1
        except Exception as err:
            self._finish(session, accepted=False)
            log.exception("the trajectory sink failed on session %s", session.session_id)
            raise GatewayError(
                500, f"the trajectory of session {session.session_id} could not be sent: {err}"
            ) from None
        self._finish(session, accepted=send)
        self.capacity_changed()
        if not send:
            await self._send_tombstone(session, trajectory)
        session.summary = {
            "completions": trajectory.completions,
            "samples": len(trajectory.samples),
            "tokens": sum(len(c.output_ids) for c in session.completions),
            "reward": session.reward,
            "sent": send,
        }
        if session.lost_calls:
            session.summary["lost_calls"] = session.lost_calls
        session.completions = []  # the trajectory has them now; keep the status small
        return {"session_id": session.session_id, **session.summary}

    async def _send_tombstone(self, session: Session, trajectory: Trajectory) -> None:
        """Tell the trainer that a member of a sized group will not come (an empty trajectory
        marked ``discarded``), so the group it waits for is complete without it. Best effort:
        the trainer still releases a group that waited too long."""
        size = session.metadata.get("group_size")
        if self.sink is None or not isinstance(size, int) or size < 2:
            return
        tombstone = dataclasses.replace(
            trajectory,
            samples=[],
            turns=[],
            reward=None,
            metadata={**trajectory.metadata, "discarded": True},
        )
        try:
            await self.sink.put(tombstone)
        except Exception:
            log.exception("the tombstone of discarded session %s was not sent", session.session_id)

    def _finish(self, session: Session, *, accepted: bool) -> None:
        """An episode's outcome, to the budget and the journal."""
        self.budget.finish(accepted=accepted)
        self.journal.note(ACCEPT if accepted else REJECT, session.session_id)

    def too_stale(self, session: Session) -> int | None:
        """How many versions the oldest generated token of an open ``session`` is behind the
        clock, when that is more than ``staleness_threshold`` (the trainer would drop the episode
        whatever comes next); ``None`` while it can still train."""
        threshold, oldest = self.budget.staleness_threshold, session.oldest_version
        if threshold is None or oldest is None or not session.is_open:
            return None
        behind = self.budget.version - oldest
        return behind if behind > threshold else None

    async def end_stale(self, session: Session, behind: int) -> None:
        """End a too-stale episode as discarded, so its budget slot frees at once."""
        await self.end(session, discard=True)
        assert session.summary is not None
        session.summary["stale"] = True
        self.refused_stale += 1
        log.info("session %s is %d versions behind; discarded", session.session_id, behind)

    async def refuse_if_stale(self, session: Session) -> None:
        """Refuse a turn of an episode that is already too stale to train, and end it as
        discarded: ending it now frees its budget slot instead of spending tokens on it."""
        behind = self.too_stale(session)
        if behind is None:
            return
        threshold, version = self.budget.staleness_threshold, self.budget.version
        oldest = session.oldest_version
        await self.end_stale(session, behind)
        raise GatewayError(
            410,
            f"session {session.session_id} is too stale to train: its oldest generated token is "
            f"from version {oldest}, the trainer is at version {version}, and the staleness "
            f"threshold is {threshold}; the episode was ended as discarded, start a new one",
            code="session_stale",
        )

    def _retire(self, session: Session) -> None:
        session.ended_at = time.time()
        self._by_key.pop(session.api_key, None)
        if session.hint and self._by_hint.get(session.hint) is session:
            del self._by_hint[session.hint]
        self._by_id.pop(session.session_id, None)
        self._ended[session.session_id] = session
        while len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)

    def get(self, session_id: str) -> Session | None:
        return self._by_id.get(session_id) or self._ended.get(session_id)

    def open_sessions(self) -> list[Session]:
        return list(self._by_id.values())

    async def expire_idle(self) -> list[str]:
        """End, as discarded, every open session idle for ``idle_timeout`` seconds or more of
        ``loop_clock`` (so not for the seconds the gateway itself stood still:
        :mod:`areal.gateway.reaper_rounds`), so the staleness budget gets their slots back (a
        rollout worker that crashed mid-episode must not hold them forever). Returns their ids."""
        if self.idle_timeout is None:
            return []
        now = self.loop_clock()
        stale = [
            s
            for s in self._by_id.values()
            if s.owner is None and s.idle_for(now) >= self.idle_timeout
        ]
        ended = []
        for session in stale:
            if not session.is_open:  # ended meanwhile (end() may await the sink)
                continue
            await self.end(session, discard=True)
            assert session.summary is not None
            session.summary["expired"] = True
            ended.append(session.session_id)
            log.info(
                "session %s expired after %.1f s without activity; discarded",
                session.session_id,
                now - session.last_active,
            )
        self.expired += len(ended)
        return ended

    async def discard_matching(self, metadata: dict[str, Any]) -> list[str]:
        """End, as discarded, every open session whose metadata has all of ``metadata``'s
        key/values (e.g. ``{"worker": "3"}``: the sessions of a rollout worker being restarted)."""
        matching = [
            s
            for s in self._by_id.values()
            if all(k in s.metadata and s.metadata[k] == v for k, v in metadata.items())
        ]
        ended = []
        for session in matching:
            if session.is_open:  # (not ended meanwhile)
                await self.end(session, discard=True)
                ended.append(session.session_id)
        self.discarded += len(ended)
        return ended
