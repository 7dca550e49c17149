"""Online agents (``--online``): conversations of agents that call with the plain gateway key.

An agent deployed elsewhere never opens a session; with ``--online`` the gateway opens one per
conversation for it, keyed by the ``x-areal-conversation`` request header or the client's own
session hint (:func:`areal.gateway.episodes.session_hint`), through the same
:class:`~areal.gateway.sessions.SessionManager` and staleness budget as a rollout worker's
sessions: a full budget is a 429, never an answer that goes unrecorded.

A conversation is ``open`` while calls come (later calls with its key join it), ``awaiting`` its
reward once it ended (an idle timeout, or an end without a reward), then ``ended`` (the reward
came: its episode went to the trajectory sink like any other) or ``discarded`` (no reward within
the wait, or too stale to train: its budget slot is released, nothing is trained). Each is
trained in a group (:mod:`areal.gateway.online_groups`): the one its first call named, else the
one ``--online-grouping`` gives it as it goes to the trainer. This module keeps that state and
knows nothing of requests (:mod:`areal.gateway.online_api` serves it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from areal.gateway.errors import GatewayError
from areal.gateway.online_groups import NAMED, DefaultGroups
from areal.gateway.reaper_rounds import LoopClock, reap_in_rounds
from areal.gateway.sessions import Session, SessionManager

log = logging.getLogger("areal.gateway.online")

OWNER = "online"  # Session.owner: these sessions end by the rules below, not the session reaper
KEPT = 4096  # finished conversations whose status can still be asked for
ANSWERS_KEPT = 65536  # response ids that still find their conversation
REAP_EVERY_S = 5.0  # at most; short timeouts are checked more often

OPEN, AWAITING, ENDED, DISCARDED = "open", "awaiting", "ended", "discarded"


@dataclass
class Conversation:
    """One conversation of an online agent: its key, its session (the episode) and where it is.
    Its times are on its manager's ``loop_clock``."""

    key: str
    session: Session
    last_active: float
    state: str = OPEN
    busy: int = 0  # calls of it still running: it is not idle
    ended_at: float | None = None  # when it stopped taking calls
    group: str | None = None  # the group its first call named (online_groups), as named
    prompt: str | None = None  # its first user message's digest, for ``--online-grouping prompt``

    @property
    def finished(self) -> bool:
        return self.state in (ENDED, DISCARDED)

    def status(self, now: float, reward_wait: float) -> dict[str, Any]:
        session = self.session
        out: dict[str, Any] = {
            "conversation": self.key,
            "session_id": session.session_id,
            "status": self.state,
            # its trainer's group key: named, or the default one once it went to the trainer
            "group": session.metadata.get("group"),
            "reward": session.reward,
            "created": session.created,
        }
        if self.state == OPEN:
            out["completions"] = len(session.completions)
            out["idle_s"] = 0.0 if self.busy else round(now - self.last_active, 3)
        elif self.state == AWAITING:
            out["completions"] = len(session.completions)
            assert self.ended_at is not None
            out["reward_wait_left_s"] = round(max(0.0, self.ended_at + reward_wait - now), 3)
        else:
            out.update(session.summary or {})
        return out


class OnlineConversations:
    """The conversations of online agents, admitted into ``sessions`` and ended by the rules of
    the module docstring: ``idle_timeout`` seconds without a call end one, ``reward_wait``
    seconds without a reward after that discard it. Both are seconds of ``loop_clock``, which
    follows ``clock`` (injectable for tests) less the seconds the gateway's loop stood still
    (:mod:`areal.gateway.reaper_rounds`). ``groups`` gives a conversation that named no group
    its group (default: ``pool``, on ``clock``)."""

    def __init__(
        self,
        sessions: SessionManager,
        *,
        idle_timeout: float,
        reward_wait: float,
        groups: DefaultGroups | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if idle_timeout <= 0:
            raise ValueError(f"the online idle timeout must be > 0, got {idle_timeout}")
        if reward_wait < 0:
            raise ValueError(f"the online reward wait must be >= 0, got {reward_wait}")
        self.sessions = sessions
        self.idle_timeout = idle_timeout
        self.reward_wait = reward_wait
        self.groups = groups or DefaultGroups(clock=clock)
        self.counts = {"opened": 0, ENDED: 0, DISCARDED: 0}
        self.loop_clock = LoopClock(clock)  # its reaper's rounds drive it
        self._open: dict[str, Conversation] = {}  # by key
        self._all: OrderedDict[str, Conversation] = OrderedDict()  # by session id, oldest first
        self._latest: dict[str, Conversation] = {}  # the newest conversation of each key
        self._answers: OrderedDict[str, Conversation] = OrderedDict()  # by response id
        self._task: asyncio.Task[None] | None = None

    # --- calls ----------------------------------------------------------------------------------

    async def admit(
        self, key: str, *, group: str | None = None, prompt: str | None = None
    ) -> tuple[Conversation, bool]:
        """The open conversation of ``key`` for one more call (``True``: opened for this call),
        which names ``group`` (or none) and asks ``prompt`` (a digest) first.

        A new one must fit the staleness budget (else the 429 of ``SessionManager.open``); an
        open one too stale to train is discarded and a fresh one, in its group, takes its place.
        A call naming another group than its conversation's first call is a 409.
        """
        while (conversation := self._open.get(key)) is not None:
            if not conversation.session.is_open:  # ended around us (shutdown, discard by metadata)
                self._close_out(conversation, DISCARDED)
                continue
            _same_group(conversation, group)
            behind = self.sessions.too_stale(conversation.session)
            if behind is None:
                conversation.busy += 1
                conversation.last_active = self.loop_clock()
                return conversation, False
            self._close_out(conversation, DISCARDED)
            await self.sessions.end_stale(conversation.session, behind)
            group, prompt = conversation.group, conversation.prompt  # the episode goes on afresh
        metadata: dict[str, Any] = {"online": True, "conversation": key}
        if group is not None:
            metadata["group"] = NAMED + group
        session = self.sessions.open(metadata=metadata, owner=OWNER)
        conversation = Conversation(
            key, session, self.loop_clock(), busy=1, group=group, prompt=prompt
        )
        self._open[key] = self._latest[key] = conversation
        self._all[session.session_id] = conversation
        self.counts["opened"] += 1
        self._prune()
        return conversation, True

    async def call_done(self, conversation: Conversation, *, opened: bool, failed: bool) -> None:
        """A call of ``conversation`` is over. A failed first call leaves nothing to train, so the
        conversation it opened goes at once and gives its budget slot back."""
        conversation.busy -= 1
        conversation.last_active = self.loop_clock()
        session = conversation.session
        nothing = not session.completions and conversation.busy == 0
        if opened and failed and nothing and conversation.state == OPEN and session.is_open:
            self._close_out(conversation, DISCARDED)
            await self.sessions.end(session, discard=True)

    def answered(self, response_id: str, conversation: Conversation) -> None:
        """Remember which conversation a response id the client got belongs to (for rewards)."""
        self._answers[response_id] = conversation
        while len(self._answers) > ANSWERS_KEPT:
            self._answers.popitem(last=False)

    # --- finding one ----------------------------------------------------------------------------

    def find(self, name: str) -> Conversation | None:
        """A conversation by its session id, else the newest one of a key."""
        return self._all.get(name) or self._latest.get(name)

    def by_answer(self, response_id: str) -> Conversation | None:
        return self._answers.get(response_id)

    def listing(self) -> dict[str, Any]:
        now = self.loop_clock()
        live = [c for c in self._all.values() if not c.finished]
        return {
            "open": [c.status(now, self.reward_wait) for c in live if c.state == OPEN],
            "awaiting": [c.status(now, self.reward_wait) for c in live if c.state == AWAITING],
            "idle_timeout": self.idle_timeout,
            "reward_wait": self.reward_wait,
            "counts": dict(self.counts),
            "budget": self.sessions.budget.snapshot().to_json(),
        }

    def status(self, conversation: Conversation) -> dict[str, Any]:
        return conversation.status(self.loop_clock(), self.reward_wait)

    # --- the end of one -------------------------------------------------------------------------

    async def end(
        self, conversation: Conversation, reward: float | None = None, *, discard: bool = False
    ) -> dict[str, Any]:
        """Stop taking calls; with a reward (given now or before) the episode goes to training,
        without one it waits for it. Ending one that awaits its reward again is a no-op."""
        if conversation.finished:
            raise GatewayError(
                409,
                f"conversation {conversation.key!r} ({conversation.session.session_id}) has "
                f"already {conversation.state}",
                code="conversation_ended",
            )
        if conversation.state == OPEN:
            self._stop_calls(conversation)
        session = conversation.session
        if discard or not session.completions:  # nothing to train: no wait for a reward
            await self._discard(conversation)
        elif reward is not None:
            return await self.reward(conversation, reward)
        elif session.reward is not None:
            await self._train(conversation)
        return self.status(conversation)

    async def reward(self, conversation: Conversation, reward: float) -> dict[str, Any]:
        """The conversation's reward: kept while it is open, trained on at once once it ended."""
        if conversation.finished or not conversation.session.is_open:
            raise GatewayError(
                409,
                f"conversation {conversation.key!r} ({conversation.session.session_id}) has "
                f"already {conversation.state}; its reward can no longer change",
                code="conversation_ended",
            )
        self.sessions.set_reward(conversation.session, reward)
        if conversation.state == AWAITING:
            await self._train(conversation)
        return self.status(conversation)

    async def expire(self) -> None:
        """End the idle open conversations; discard those whose reward wait is over (both
        measured on ``loop_clock``: not counting the seconds the gateway stood still)."""
        now = self.loop_clock()
        for conversation in list(self._all.values()):
            if conversation.finished or not conversation.session.is_open:
                if not conversation.finished:
                    self._close_out(conversation, DISCARDED)
                continue
            if conversation.state == OPEN:
                idle = 0.0 if conversation.busy else now - conversation.last_active
                if idle >= self.idle_timeout:
                    log.info(
                        "online conversation %r ended after %.1f s idle", conversation.key, idle
                    )
                    await self.end(conversation)
            elif (
                conversation.ended_at is not None
                and now - conversation.ended_at >= self.reward_wait
            ):
                log.info("online conversation %r got no reward: discarded", conversation.key)
                await self._discard(conversation)

    def _stop_calls(self, conversation: Conversation) -> None:
        if self._open.get(conversation.key) is conversation:
            del self._open[conversation.key]
        conversation.state = AWAITING
        conversation.ended_at = self.loop_clock()

    def _close_out(self, conversation: Conversation, state: str) -> None:
        if self._open.get(conversation.key) is conversation:
            del self._open[conversation.key]
        if conversation.ended_at is None:
            conversation.ended_at = self.loop_clock()
        conversation.state = state
        self.counts[state] += 1

    async def _train(self, conversation: Conversation) -> None:
        self._close_out(conversation, ENDED)
        metadata = conversation.session.metadata
        if "group" not in metadata:  # named none: the default rule's group, as it goes
            default = self.groups.assign(conversation.prompt)
            if default is not None:
                metadata["group"] = default
        await self.sessions.end(conversation.session)

    async def _discard(self, conversation: Conversation) -> None:
        self._close_out(conversation, DISCARDED)
        if conversation.session.is_open:
            await self.sessions.end(conversation.session, discard=True)

    def _prune(self) -> None:
        finished = [sid for sid, c in self._all.items() if c.finished]
        for sid in finished[: max(0, len(self._all) - KEPT)]:
            conversation = self._all.pop(sid)
            if self._latest.get(conversation.key) is conversation:
                del self._latest[conversation.key]

    # --- the reaper -----------------------------------------------------------------------------

    @property
    def interval(self) -> float:
        shortest = min(self.idle_timeout, self.reward_wait or self.idle_timeout)
        return min(REAP_EVERY_S, shortest / 4)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="areal-online-reaper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        await reap_in_rounds(
            self.loop_clock, lambda: self.interval, self.expire, log, "online-conversation reaper"
        )


def _same_group(conversation: Conversation, group: str | None) -> None:
    """A later call may repeat its conversation's group or name none, never name another."""
    if group is None or group == conversation.group:
        return
    first = (
        f"group {conversation.group!r}"
        if conversation.group is not None
        else "no group (it is grouped by --online-grouping)"
    )
    raise GatewayError(
        409,
        f"conversation {conversation.key!r} named {first} on its first call, and this call names "
        f"group {group!r}: all the calls of a conversation train in one group. Name the same "
        "group or none, or start another conversation (another x-areal-conversation)",
        code="group_conflict",
    )
