"""What a training run asks of the gateway beyond single sessions: the trainer's version clock,
discarding a crashed rollout worker's sessions, and the reaper of idle sessions.

Routes, under ``/rl`` and ``/gateway/rl``, all with the admin token:

- ``POST /rl/version`` ``{"version": N, "consumed": C, "dropped": D}``: the trainer's weights are
  now version ``N``. The clock never moves back, and it also follows the versions the engines
  report on generated tokens (whichever is further wins). ``C`` (optional) is how many episodes
  the trainer has received in all of the run (across resumes and gateway restarts), ``D``
  (optional) how many of them it dropped as stale: the budget's ``accepted`` becomes at least
  ``C - D`` (``StalenessBudget.reseed``), so a restarted gateway admits the look-ahead only, and
  re-announcing the same totals changes nothing. ``weights`` (optional) is the directory holding
  this version's weights: an engine attached later loads them before it takes traffic
  (:mod:`areal.gateway.engines_api`); one not at ``N`` with nothing to load (a collective sync)
  is held until it serves the run's version (:mod:`areal.gateway.engine_pool`). ``trainer_id``
  (optional) must be the attached trainer's (:mod:`areal.gateway.trainer_api`), whose lease the
  announce renews. Answers the budget snapshot (with ``weights`` once known), as does
  ``GET /rl/version``.
- ``POST /rl/sessions/discard`` ``{"metadata": {"worker": "3"}}``: end, as discarded, every open
  session whose metadata has all the given key/values (compared as JSON values: ``"3"`` is not
  ``3``); answers ``{"discarded": n, "session_ids": [...]}``. The run supervisor calls it when it
  restarts a crashed rollout worker, so the dead worker's episodes give their budget slots back.

The reaper runs on the gateway's event loop and ends, as discarded, the sessions that saw no
activity for the manager's ``idle_timeout``: the safety net for drivers that die without telling
anyone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from aiohttp import web

from areal.gateway.errors import GatewayError
from areal.gateway.gateway_state import state_of
from areal.gateway.reaper_rounds import reap_in_rounds
from areal.gateway.request_body import read_json
from areal.gateway.session_api import require_admin
from areal.gateway.sessions import SessionManager
from areal.gateway.trainer_api import check_trainer

log = logging.getLogger("areal.gateway.sessions")

REAP_EVERY_S = 5.0  # at most; a short idle timeout is checked more often


def add_routes(app: web.Application, prefixes: tuple[str, ...], sessions: SessionManager) -> None:
    def version_answer(request: web.Request) -> dict[str, Any]:
        answer = sessions.budget.snapshot().to_json()
        published = state_of(request).policy.published
        if published is not None:
            answer["weights"] = {"version": published[0], "path": published[1]}
        return answer

    async def get_version(request: web.Request) -> web.Response:
        require_admin(sessions, request)
        return web.json_response(version_answer(request))

    async def set_version(request: web.Request) -> web.Response:
        require_admin(sessions, request)
        body = await read_json(request)
        version, dropped = body.get("version"), body.get("dropped", 0)
        consumed = body.get("consumed", 0)
        for name, value in (("version", version), ("consumed", consumed), ("dropped", dropped)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise GatewayError(
                    400,
                    f"{name} must be a non-negative integer, got {value!r}",
                    param=name,
                    code=f"bad_{name}",
                )
        assert isinstance(version, int) and isinstance(dropped, int) and isinstance(consumed, int)
        weights = body.get("weights")
        if weights is not None and (not isinstance(weights, str) or not weights):
            raise GatewayError(
                400, "weights must be the directory of this version's weights", param="weights"
            )
        state = state_of(request)
        check_trainer(state, body.get("trainer_id"))
        sessions.budget.set_version(version)
        state.policy.pool.announced(version)  # engines behind the run's version are held
        sessions.budget.reseed(consumed=consumed, dropped=dropped, pending=sessions.delivering)
        sessions.capacity_changed()
        if weights is not None and (state.policy.published or (-1, ""))[0] <= version:
            state.policy.published = (version, weights)
        return web.json_response(version_answer(request))

    async def discard(request: web.Request) -> web.Response:
        require_admin(sessions, request)
        metadata = (await read_json(request)).get("metadata")
        if not isinstance(metadata, dict) or not metadata:
            raise GatewayError(
                400,
                "metadata must be a non-empty JSON object of the key/values the sessions to "
                f'discard share, e.g. {{"worker": "3"}}; got {metadata!r}',
                param="metadata",
            )
        ids = await sessions.discard_matching(metadata)
        if ids:
            log.info("discarded %d sessions with metadata %s", len(ids), metadata)
        return web.json_response({"discarded": len(ids), "session_ids": ids})

    for prefix in prefixes:
        app.router.add_get(f"{prefix}/version", get_version)
        app.router.add_post(f"{prefix}/version", set_version)
        app.router.add_post(f"{prefix}/sessions/discard", discard)


class IdleReaper:
    """A task on the gateway's loop that calls ``sessions.expire_idle()`` every few seconds."""

    def __init__(self, sessions: SessionManager) -> None:
        self.sessions = sessions
        self._task: asyncio.Task[None] | None = None

    @property
    def interval(self) -> float:
        timeout = self.sessions.idle_timeout or REAP_EVERY_S
        return min(REAP_EVERY_S, timeout / 4)

    def start(self) -> None:
        if self.sessions.idle_timeout is not None and self._task is None:
            self._task = asyncio.create_task(self._run(), name="areal-session-reaper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        await reap_in_rounds(
            self.sessions.loop_clock,
            lambda: self.interval,
            self.sessions.expire_idle,
            log,
            "idle-session reaper",
        )
