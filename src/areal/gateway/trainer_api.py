"""``/rl/trainer``: a training run attaches to a gateway that runs on its own, and leaves it running.

A long-lived gateway (``python -m areal.gateway.server --config R --port 9000``) serves agents
before, during and after a run. ``areal train`` pointed at it takes its *trainer seat*: from then
on finished episodes go to that run's trajectory queue and new ones are admitted under that run's
staleness budget; the run attaches its engines (``/rl/engines``, owned by the run) and announces
its versions (``/rl/version``, which also renews the seat's lease). One policy, one trainer: a
second run gets ``409`` while the seat is held and its lease (renewed by every announce) runs.

Routes, under ``/rl`` and ``/gateway/rl``, all with the admin token:

- ``POST /rl/trainer`` ``{"trainer_id", "sink": "zmq", "sink_address", "staleness_threshold",
  "trigger_batch_size", "max_concurrent", "version", "consumed", "dropped", "discount",
  "lease_s", "sampling", "episode_journal"}`` (the names of the gateway's training flags;
  ``sampling``: the run's temperature, top_p, max_tokens and override_client_sampling for the
  policy while it holds the seat, the router file's again after; ``episode_journal``: the run's
  episode books, a file the gateway appends to while the seat is held): take the seat. Episodes
  open at that moment are discarded (their tokens belong to no run, or to another run). The same
  ``trainer_id`` again renews the lease and changes nothing else.
- ``DELETE /rl/trainer`` ``{"trainer_id"}``: leave. The run's engines are detached, open episodes
  are discarded, the sink is closed and the budget is unbounded again; the gateway serves on.
- ``GET /rl/trainer``: who holds the seat, since when, when it was last heard from.

A seat whose lease ran out (a run killed without leaving) is taken over by the next run, which
also detaches the engines the dead run had attached.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from areal.core.episode_journal import EpisodeJournal
from areal.core.queue import make_sink
from areal.core.staleness import StalenessBudget
from areal.gateway.errors import GatewayError
from areal.gateway.gateway_state import GatewayState, state_of
from areal.gateway.request_body import optional_json, read_json
from areal.gateway.router_config import ModelRoute
from areal.gateway.session_api import require_admin
from areal.gateway.trainer_seat import DEFAULT_LEASE_S, TrainerSeat
from areal.gateway.training_flags import SEAT_KEYS, TrainingFlags

log = logging.getLogger("areal.gateway.trainer")


def check_trainer(state: GatewayState, trainer_id: Any) -> None:
    """A call that names a trainer (``POST /rl/version``) must come from the seat's holder; it
    renews the lease."""
    if trainer_id is None:
        return
    seat = state.trainer
    if seat is None or seat.trainer_id != trainer_id:
        holder = f"trainer {seat.trainer_id}" if seat else "no trainer"
        raise GatewayError(
            409,
            f"trainer {trainer_id!r} is not attached to this gateway ({holder} is): attach with "
            "POST /rl/trainer first",
            param="trainer_id",
            code="trainer_not_attached",
        )
    seat.renew()


def add_routes(app: web.Application, prefixes: tuple[str, ...]) -> None:
    async def attach(request: web.Request) -> web.Response:
        state = state_of(request)
        require_admin(state.sessions, request)
        body = await read_json(request)
        trainer_id = _trainer_id(body)
        seat = state.trainer
        if seat is not None and seat.trainer_id == trainer_id:
            seat.renew()
            return web.json_response(_answer(state))
        if seat is not None and not seat.lapsed():
            raise GatewayError(
                409,
                f"policy {state.policy.model_id} already has a trainer: {seat.trainer_id}, "
                f"attached at {time.strftime('%H:%M:%S', time.localtime(seat.since))}, last "
                f"heard {seat.clock() - seat.heard:.0f}s ago; stop that run first (or wait "
                f"{seat.lease_s:g}s after its last announce for its lease to lapse)",
                code="trainer_attached",
            )
        flags = _flags(body)
        lease = _lease(body.get("lease_s", DEFAULT_LEASE_S))
        route = _sampling(state.policy.route, body.get("sampling"))
        journal = _journal(flags.episode_journal)
        if seat is not None:
            log.warning(
                "trainer %s stopped announcing; %s takes its seat", seat.trainer_id, trainer_id
            )
            await _release(state, seat)
        discarded = await _discard_open(state)
        old_sink = state.sessions.sink
        try:
            sink = make_sink(flags.sink, flags.sink_options()) if flags.sink_name() else None
        except (OSError, ValueError) as err:
            if journal is not None:
                journal.close()
            raise GatewayError(
                400,
                f"the trajectory sink {flags.sink} cannot be opened: {err}",
                param="sink_address",
            ) from None
        state.sessions.sink = sink
        budget = flags.budget()
        budget.carry_running(state.sessions.budget)
        state.sessions.budget = budget
        state.sessions.discount = flags.discount
        state.sessions.capacity_changed()
        await _close_quietly(old_sink)
        state.trainer = TrainerSeat(trainer_id, lease_s=lease)
        if route is not None:
            state.trainer.route_before, state.policy.route = state.policy.route, route
        if journal is not None:
            state.trainer.journal_before, state.sessions.journal = state.sessions.journal, journal
        log.info(
            "trainer %s attached: episodes to %s, budget %s (%d open episodes discarded)",
            trainer_id,
            flags.sink_address or flags.sink,
            budget.snapshot().to_json(),
            discarded,
        )
        return web.json_response(_answer(state))

    async def leave(request: web.Request) -> web.Response:
        state = state_of(request)
        require_admin(state.sessions, request)
        body = await optional_json(request)
        trainer_id = _trainer_id(body)
        seat = state.trainer
        if seat is None or seat.trainer_id != trainer_id:
            raise GatewayError(
                409,
                f"trainer {trainer_id!r} does not hold this gateway's trainer seat",
                param="trainer_id",
                code="trainer_not_attached",
            )
        detached = await _release(state, seat)
        log.info("trainer %s left; %d of its engines detached", trainer_id, detached)
        return web.json_response({"left": trainer_id, "engines_detached": detached})

    async def describe(request: web.Request) -> web.Response:
        state = state_of(request)
        require_admin(state.sessions, request)
        seat = state.trainer
        return web.json_response({"trainer": seat.describe() if seat else None})

    for prefix in prefixes:
        app.router.add_post(f"{prefix}/trainer", attach)
        app.router.add_delete(f"{prefix}/trainer", leave)
        app.router.add_get(f"{prefix}/trainer", describe)


async def _release(state: GatewayState, seat: TrainerSeat) -> int:
    """The seat is free again: the run's engines go, its open episodes are discarded, its sink
    closes, and the budget admits everything (a gateway without a trainer)."""
    state.trainer = None
    state.policy.pool.announced(None)  # no run: no engine is held behind its version
    if seat.route_before is not None:
        state.policy.route = seat.route_before
    owned = [e.url for e in state.policy.pool.engines.values() if e.owner == seat.trainer_id]
    for url in owned:
        await state.policy.pool.detach(url)
    # The sink first: the run's queue may be closed already (or its process gone), and a
    # discarded episode's tombstone sent there would wait for an answer that never comes.
    sink, state.sessions.sink = state.sessions.sink, None
    await _close_quietly(sink)
    await _discard_open(state)
    if seat.journal_before is not None:
        state.sessions.journal.close()
        state.sessions.journal = seat.journal_before
    budget = StalenessBudget()
    budget.carry_running(state.sessions.budget)
    state.sessions.budget = budget
    state.sessions.capacity_changed()
    return len(owned)


async def _close_quietly(sink: Any) -> None:
    """Close a run's sink; one whose trainer is gone cannot acknowledge, which is logged."""
    if sink is None:
        return
    try:
        await sink.close()
    except Exception as err:  # a QueueError naming the unacknowledged trajectories
        log.warning("the previous run's trajectory sink closed uncleanly: %s", err)


async def _discard_open(state: GatewayState) -> int:
    sessions = state.sessions
    ended = 0
    for session in sessions.open_sessions():
        if session.is_open:
            await sessions.end(session, discard=True)
            ended += 1
    return ended


def _answer(state: GatewayState) -> dict[str, Any]:
    assert state.trainer is not None
    return {
        **state.trainer.describe(),
        "budget": state.sessions.budget.snapshot().to_json(),
        "engines": state.policy.pool.describe(),
    }


def _trainer_id(body: dict[str, Any]) -> str:
    value = body.get("trainer_id")
    if not isinstance(value, str) or not value:
        raise GatewayError(400, "trainer_id must be a non-empty string", param="trainer_id")
    return value


TEXT_FLAGS = ("sink", "sink_address", "episode_journal")


def _flags(body: dict[str, Any]) -> TrainingFlags:
    """The run's settings, checked by the same rules as the gateway's command-line flags."""
    values: dict[str, Any] = {"sink": "zmq"}
    for key, name in SEAT_KEYS.items():
        if key in body and body[key] is not None:
            value = body[key]
            kind: tuple[type, ...] = (str,) if name in TEXT_FLAGS else (int,)
            if name == "discount":
                kind = (int, float)
            if isinstance(value, bool) or not isinstance(value, kind):
                what = (
                    "a string" if kind == (str,) else "an integer" if kind == (int,) else "a number"
                )
                raise GatewayError(400, f"{key} must be {what}, got {value!r}", param=key)
            values[name] = value
    try:
        return TrainingFlags(**values).check()
    except (TypeError, ValueError) as err:
        raise GatewayError(400, str(err)) from None


SAMPLING_KEYS = ("temperature", "top_p", "max_tokens", "override_client_sampling")


def _sampling(route: ModelRoute, value: Any) -> ModelRoute | None:
    """The run's sampling for the policy while it holds the seat (its ``sampling.*``), checked
    by the router's own rules; ``None``: keep the router file's."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - set(SAMPLING_KEYS):
        raise GatewayError(
            400, f"sampling must be an object with some of {', '.join(SAMPLING_KEYS)}",
            param="sampling",
        )  # fmt: skip
    try:
        return ModelRoute.model_validate({**route.model_dump(), **value})
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise GatewayError(400, f"sampling.{where}: {first['msg']}", param="sampling") from None


def _journal(path: str | None) -> EpisodeJournal | None:
    if path is None:
        return None
    try:
        return EpisodeJournal(path)
    except OSError as err:
        raise GatewayError(
            400, f"episode_journal cannot be opened: {err}", param="episode_journal"
        ) from None


def _lease(value: Any) -> float:
    seconds = _seconds(value)
    if not 1 <= seconds < math.inf:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise GatewayError(
            400, f"lease_s must be a number of seconds >= 1, got {shown}", param="lease_s"
        )
    return seconds


def _seconds(value: Any) -> float:
    """A JSON number as seconds; NaN for anything else, infinity for an integer too large for a
    float (JSON's integers have no bound)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    try:
        return float(value)
    except OverflowError:
        return math.inf
