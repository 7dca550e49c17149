"""One typed client for the gateway's admin API (``/rl/*``, the admin token).

The trainer (version clock, status, discarding a crashed worker's sessions), the rollout workers
(opening, rewarding and ending sessions), ``areal probe`` (a session's trace) and ``areal serve
inference --attach`` (attaching and detaching engines) all talk to the same routes; this is the one place that knows their paths, bodies and answers. Every method
raises a :class:`GatewayAdminError` naming the cause; callers for whom the gateway is only
bookkeeping wrap the call in :func:`best_effort` instead (``None`` when it fails). Answers are
typed views of the gateway's JSON (see :mod:`areal.gateway.sessions` and
:mod:`areal.gateway.rl_control` for the routes); no gateway code is imported.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Mapping
from typing import Any, TypedDict, TypeVar, cast

import aiohttp

__all__ = [
    "Budget",
    "Detached",
    "Discarded",
    "EngineEntry",
    "EngineList",
    "GatewayAdmin",
    "GatewayAdminError",
    "GatewayBusy",
    "GatewayRefused",
    "GatewayUnauthorized",
    "GatewayUnreachable",
    "OpenedSession",
    "RewardSet",
    "SessionSummary",
    "SessionsStatus",
    "Trace",
    "best_effort",
    "retry_after",
]

log = logging.getLogger("areal.gateway_client")
T = TypeVar("T")
DEFAULT_TIMEOUT_S = 10.0
# An engine behind the newest published weights loads them before the attach answers.
ATTACH_TIMEOUT_S = 600.0


# --- the answers --------------------------------------------------------------------------------


class OpenedSession(TypedDict):
    session_id: str
    api_key: str  # the episode's key, for the agent


class RewardSet(TypedDict):
    session_id: str
    completion_id: str | None
    reward: float


class SessionSummary(TypedDict, total=False):
    """What ``end`` answers (and an ended session's status adds): ``sent`` says whether a
    trajectory went to the trainer."""

    session_id: str
    completions: int
    samples: int
    tokens: int
    reward: float | None
    sent: bool
    expired: bool


class Budget(TypedDict, total=False):
    """The staleness budget's counters (``capacity`` ``None``: unbounded). Like the status, not
    total: a reader of counters copes with a gateway of another version."""

    version: int
    accepted: int
    running: int
    rejected: int
    capacity: int | None
    accepted_total: int
    released: int


class SessionsStatus(TypedDict, total=False):
    open: list[str]
    open_by_worker: dict[str, int]  # in-flight episodes per rollout worker
    budget: Budget
    waiting: int  # long polls held for a slot now: the workers the budget holds back
    discount: float
    idle_timeout: float | None
    expired: int
    discarded: int
    delivering: int  # ended episodes whose trajectory waits for the queue's acknowledgement


class Discarded(TypedDict):
    discarded: int
    session_ids: list[str]


class EngineEntry(TypedDict, total=False):
    """One attached engine as ``/rl/engines`` describes it (see :mod:`areal.gateway.engine_pool`)."""

    url: str
    backend: str
    owner: str | None
    healthy: bool
    draining: bool
    running: int  # calls running on it now
    served: int  # calls it finished
    weight_version: str | None
    held: bool  # it does not serve the run's version yet: no traffic while another can take it
    attached_s: float


class EngineList(TypedDict):
    policy: str
    engines: list[EngineEntry]


class Detached(TypedDict):
    """How a detach went: the calls that finished while it drained, and those cut short."""

    detached: str
    finished: int
    aborted: int


class Trace(TypedDict):
    """What an open session did (``areal.gateway.trace``)."""

    session_id: str
    policy_model: str
    calls: list[dict[str, Any]]
    aborted: int
    turns: list[dict[str, Any]]


# --- the failures -------------------------------------------------------------------------------


class GatewayAdminError(RuntimeError):
    """An admin call failed; the message says which call, at which gateway, and why."""

    def __init__(self, message: str, *, url: str, call: str) -> None:
        super().__init__(message)
        self.url = url
        self.call = call  # e.g. "POST /rl/sessions"


class GatewayUnreachable(GatewayAdminError):
    """Nothing answered (connection refused, reset, timed out); ``cause`` is the client's error."""

    def __init__(self, *, url: str, call: str, cause: BaseException) -> None:
        super().__init__(
            f"cannot reach the gateway at {url} for {call} ({type(cause).__name__}: {cause})",
            url=url,
            call=call,
        )
        self.cause = cause


class GatewayRefused(GatewayAdminError):
    """The gateway answered with an error status; ``code`` and ``reason`` are its own words."""

    def __init__(
        self, *, url: str, call: str, status: int, reason: str, code: str | None = None
    ) -> None:
        label = f"HTTP {status}" + (f" {code}" if code else "")
        super().__init__(self._message(url, call, label, reason), url=url, call=call)
        self.status = status
        self.code = code
        self.reason = reason

    @staticmethod
    def _message(url: str, call: str, label: str, reason: str) -> str:
        return f"the gateway at {url} refused {call} ({label}): {reason}"


class GatewayUnauthorized(GatewayRefused):
    """401/403: the token sent is not the gateway's admin token."""

    @staticmethod
    def _message(url: str, call: str, label: str, reason: str) -> str:
        return (
            f"the gateway at {url} refused the admin token on {call} ({label}): "
            f"AREAL_ADMIN_TOKEN must be the token the gateway was started with; it said: {reason}"
        )


class GatewayBusy(GatewayRefused):
    """429: no room under the staleness budget (or a fixed key is busy); ask again after
    ``retry_after`` seconds."""

    def __init__(self, *, retry_after: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.retry_after = retry_after


def retry_after(value: str | None) -> float:
    """Seconds from a ``Retry-After`` header: 1 when missing or unreadable, at least 0.1."""
    try:
        wait = float(value) if value is not None else 1.0
    except ValueError:
        wait = 1.0
    return max(0.1, wait)


async def best_effort(call: Awaitable[T]) -> T | None:
    """``call``'s answer, or ``None`` when the gateway is unreachable or refuses: for the
    trainer's bookkeeping (announcing its version, reading the status), which must never stop a
    run because a gateway is restarting."""
    try:
        return await call
    except GatewayAdminError as err:
        log.debug("ignored: %s", err)
        return None


# --- the client ---------------------------------------------------------------------------------


class GatewayAdmin:
    """The admin API of the gateway at ``url`` (without ``/v1``), with ``admin_token``.

    ``http``: a session to send through (its timeout applies; the caller closes it); without one
    each call opens its own with ``timeout_s``, or ``async with GatewayAdmin(...)`` holds one.
    """

    def __init__(
        self,
        url: str,
        admin_token: str,
        *,
        http: aiohttp.ClientSession | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.url = url.rstrip("/")
        self.admin_token = admin_token
        self.http = http
        self.timeout_s = timeout_s
        self._owned: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:  # never the token
        return f"GatewayAdmin({self.url!r})"

    async def __aenter__(self) -> GatewayAdmin:
        if self.http is None:
            self.http = self._owned = self._session()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._owned is not None:
            await self._owned.close()
            self.http = self._owned = None

    # --- sessions ---------------------------------------------------------------------------

    async def open_session(
        self,
        *,
        metadata: Mapping[str, Any] | None = None,
        task_id: str | int | None = None,
        hint: str | None = None,
        api_key: str | None = None,
        wait_s: float | None = None,
    ) -> OpenedSession:
        """Open an episode. ``api_key``: a fixed key instead of a fresh one; ``wait_s``: a long
        poll (the gateway holds the request until a slot frees). A full budget raises
        :class:`GatewayBusy` with the gateway's ``Retry-After``."""
        body: dict[str, Any] = {"metadata": dict(metadata or {})}
        for name, value in (("task_id", task_id), ("hint", hint), ("api_key", api_key)):
            if value is not None:
                body[name] = value
        if wait_s is not None:
            body["wait_s"] = wait_s
        return cast(OpenedSession, await self._call("POST", "/rl/sessions", body))

    async def reward(
        self, session_id: str, reward: float, *, completion_id: str | None = None
    ) -> RewardSet:
        """The episode's reward, or one completion's (a turn's); the last value set wins."""
        body: dict[str, Any] = {"reward": reward}
        if completion_id is not None:
            body["completion_id"] = completion_id
        path = f"/rl/sessions/{session_id}/reward"
        return cast(RewardSet, await self._call("POST", path, body))

    async def end(
        self, session_id: str, *, reward: float | None = None, discard: bool = False
    ) -> SessionSummary:
        """End the episode: its trajectory goes to the trainer, unless ``discard`` (or empty)."""
        body: dict[str, Any] = {}
        if reward is not None:
            body["reward"] = reward
        if discard:
            body["discard"] = True
        path = f"/rl/sessions/{session_id}/end"
        return cast(SessionSummary, await self._call("POST", path, body))

    async def session(self, session_id: str) -> dict[str, Any]:
        """One session's status (open: completions so far; ended: its summary)."""
        return await self._call("GET", f"/rl/sessions/{session_id}")

    async def trace(self, session_id: str) -> Trace:
        """What an open session did: its calls and how its turns merged (``areal probe``)."""
        return cast(Trace, await self._call("GET", f"/rl/sessions/{session_id}/trace"))

    async def status(self) -> SessionsStatus:
        """The open sessions and the budget."""
        return cast(SessionsStatus, await self._call("GET", "/rl/sessions"))

    # --- the run ----------------------------------------------------------------------------

    async def discard(self, *, metadata: Mapping[str, Any]) -> Discarded:
        """End, as discarded, every open session whose metadata has all of ``metadata``."""
        body = {"metadata": dict(metadata)}
        return cast(Discarded, await self._call("POST", "/rl/sessions/discard", body))

    async def set_version(
        self,
        version: int,
        dropped: int | None = None,
        consumed: int | None = None,
        *,
        trainer_id: str | None = None,
        weights: str | None = None,
    ) -> Budget:
        """The trainer's weights are now ``version``; ``consumed``: the episodes it received in
        all of the run, ``dropped``: how many of them it dropped as stale (running totals; the
        gateway's budget continues from them, so a restarted gateway knows the run).
        ``weights``: the directory holding this version's weights, which an engine attached
        later loads before it takes traffic."""
        body: dict[str, Any] = {"version": version}
        if dropped is not None:
            body["dropped"] = dropped
        if consumed is not None:
            body["consumed"] = consumed
        if weights is not None:
            body["weights"] = weights
        if trainer_id is not None:  # the attached trainer's: renews its seat
            body["trainer_id"] = trainer_id
        return cast(Budget, await self._call("POST", "/rl/version", body))

    async def version(self) -> Budget:
        return cast(Budget, await self._call("GET", "/rl/version"))

    # --- a run attached to a gateway that runs on its own ------------------------------------

    async def attach_trainer(self, trainer_id: str, **settings: Any) -> dict[str, Any]:
        """Take the gateway's trainer seat (``/rl/trainer``): its finished episodes go to this
        run's queue under this run's budget (``settings``: sink_address, staleness_threshold,
        trigger_batch_size, max_concurrent, version, consumed, dropped, discount, sampling,
        episode_journal, lease_s). Another live trainer: :class:`GatewayRefused` with 409."""
        body = {"trainer_id": trainer_id, **settings}
        return await self._call("POST", "/rl/trainer", body)

    async def leave_trainer(self, trainer_id: str) -> dict[str, Any]:
        """Give the seat back; the gateway detaches the run's engines and serves on."""
        return await self._call("DELETE", "/rl/trainer", {"trainer_id": trainer_id})

    # --- the policy's engines ---------------------------------------------------------------

    async def attach_engine(
        self,
        url: str,
        backend: str | None = None,
        owner: str | None = None,
        *,
        timeout_s: float = ATTACH_TIMEOUT_S,
    ) -> EngineEntry:
        """Put the engine at ``url`` into service. The gateway checks it answers, makes it load
        the newest published weights if it is behind (hence the long ``timeout_s``), then routes
        calls to it; the entry says its ``weight_version``. ``owner``: who attached it, shown
        by :meth:`engines`."""
        body: dict[str, Any] = {"url": url}
        if backend is not None:
            body["backend"] = backend
        if owner is not None:
            body["owner"] = owner
        answer = await self._call("POST", "/rl/engines", body, timeout_s=timeout_s)
        return cast(EngineEntry, answer)

    async def detach_engine(self, url: str, drain: bool = True, timeout: float = 30.0) -> Detached:
        """Take the engine at ``url`` out of service: no new calls; with ``drain`` its running
        calls may finish for up to ``timeout`` seconds, the rest end as lost (their episodes
        discarded). A URL not attached raises :class:`GatewayRefused` (404)."""
        body = {"url": url, "drain": drain, "timeout": timeout}
        answer = await self._call("DELETE", "/rl/engines", body, timeout_s=timeout + self.timeout_s)
        return cast(Detached, answer)

    async def engines(self) -> EngineList:
        """The attached engines and their state."""
        return cast(EngineList, await self._call("GET", "/rl/engines"))

    # --- HTTP -------------------------------------------------------------------------------

    def _session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))

    async def _call(
        self, method: str, path: str, body: Any = None, *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """``timeout_s``: this call's own limit, for calls the gateway takes long to answer."""
        call = f"{method} {path}"
        timeout = None if timeout_s is None else aiohttp.ClientTimeout(total=timeout_s)
        try:
            if self.http is not None:
                return await self._send(self.http, method, path, body, timeout)
            async with self._session() as http:
                return await self._send(http, method, path, body, timeout)
        except GatewayAdminError:
            raise
        except aiohttp.ClientConnectionError as err:  # refused, reset, socket timeouts
            raise GatewayUnreachable(url=self.url, call=call, cause=err) from err
        except TimeoutError as err:
            raise GatewayUnreachable(url=self.url, call=call, cause=err) from err
        except aiohttp.ClientError as err:  # e.g. an answer that is not JSON
            message = f"the gateway at {self.url} failed on {call}: {err!r}"
            raise GatewayAdminError(message, url=self.url, call=call) from err

    async def _send(
        self,
        http: aiohttp.ClientSession,
        method: str,
        path: str,
        body: Any,
        timeout: aiohttp.ClientTimeout | None = None,
    ) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.admin_token}"}
        options: dict[str, Any] = {"json": body, "headers": headers}
        if timeout is not None:
            options["timeout"] = timeout
        async with http.request(method, self.url + path, **options) as resp:
            if 200 <= resp.status < 300:  # 201 for an attached engine
                data: dict[str, Any] = await resp.json()
                return data
            raise _refusal(self.url, f"{method} {path}", resp, await resp.text())


def _refusal(url: str, call: str, resp: aiohttp.ClientResponse, text: str) -> GatewayRefused:
    """The typed error for an error answer, with the gateway's own message and code."""
    reason, code = text.strip() or resp.reason or "", None
    try:
        error = json.loads(text).get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict):
        reason = str(error.get("message") or reason)
        code = error.get("code") if isinstance(error.get("code"), str) else None
    fields: dict[str, Any] = {
        "url": url, "call": call, "status": resp.status, "reason": reason, "code": code,
    }  # fmt: skip
    if resp.status in (401, 403):
        return GatewayUnauthorized(**fields)
    if resp.status == 429:
        return GatewayBusy(retry_after=retry_after(resp.headers.get("Retry-After")), **fields)
    return GatewayRefused(**fields)
