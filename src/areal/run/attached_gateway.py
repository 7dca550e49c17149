"""A run attached to a gateway that runs on its own (``agent.gateway_url``).

The seed article starts the gateway first (``python -m areal.gateway.server --config R --port
9000``) and the trainer second, its agent pointed at ``http://localhost:9000/gateway/v1``. Then
the run does not start a gateway: it takes the gateway's *trainer seat* (``POST /rl/trainer``:
finished episodes to this run's queue, admitted under this run's staleness budget, sampled with
this run's settings), registers each of its engines after every (re)start (``POST
/rl/engines``, owned by the run), announces every version with the directory of its weights (an
engine attached later loads them first), renews the seat every :data:`HEARTBEAT_S` seconds, and
at the end leaves the seat (``DELETE /rl/trainer``): the gateway detaches the run's engines and
serves on. Engines other people attached (``areal serve inference --attach``) get the run's new
weights too (:func:`areal.run.supervised_sync.gateway_engines`).

A gateway that lost the seat (restarted, or the lease lapsed) is taken again at the next
heartbeat, with the run's totals, so its budget continues where the run is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from areal.run.gateway_client import (
    GatewayAdmin,
    GatewayAdminError,
    GatewayRefused,
    GatewayUnreachable,
    best_effort,
)
from areal.run.supervisor import Child

log = logging.getLogger("areal.train")

__all__ = ["HEARTBEAT_S", "AttachError", "AttachedGateway"]

HEARTBEAT_S = 10.0
LEASE_S = 60.0  # six missed heartbeats: the run is gone, the next may take the seat


class AttachError(RuntimeError):
    """The run cannot attach to the gateway it names; the message says why and what to do."""


class AttachedGateway:
    """This run's seat at the gateway at ``url`` (see the module docstring)."""

    def __init__(
        self,
        url: str,
        admin_token: str,
        *,
        backend: str | None = None,
        trainer_id: str | None = None,
    ) -> None:
        self.backend = backend  # the run's engines' inference backend
        self.admin = GatewayAdmin(url, admin_token, timeout_s=60.0)
        self.trainer_id = (
            trainer_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        )
        self.policy_model = ""
        self.settings: dict[str, Any] = {}
        self.own_engines: list[Child] = []
        self._heartbeat: asyncio.Task[None] | None = None
        self._left = False

    @classmethod
    def from_env(cls, url: str, *, backend: str | None = None) -> AttachedGateway:
        token = os.environ.get("AREAL_ADMIN_TOKEN")
        if not token:
            raise AttachError(
                f"agent.gateway_url names the gateway at {url}: set AREAL_ADMIN_TOKEN to the admin "
                "token that gateway was started with (or drop agent.gateway_url, and model_base_url "
                "from --agent-config, to let the run start a gateway of its own)"
            )
        return cls(url, token, backend=backend)

    @property
    def url(self) -> str:
        return self.admin.url

    async def check(self) -> str:
        """The gateway answers and takes the token; the policy's model id."""
        try:
            listing = await self.admin.engines()
        except GatewayUnreachable as err:
            raise AttachError(
                f"no gateway answers at {self.url} (agent.gateway_url): start it first, e.g. "
                "`python -m areal.gateway.server --config configs/taotoken_router.yaml --port "
                "9000`, or drop agent.gateway_url to let the run start its own"
                f" ({type(err.cause).__name__})"
            ) from None
        except GatewayAdminError as err:
            raise AttachError(str(err)) from None
        self.policy_model = listing["policy"]
        return self.policy_model

    async def take_seat(self, **settings: Any) -> None:
        """Take the trainer seat with the run's settings (kept, to take it again later)."""
        self.settings = settings
        try:
            await self.admin.attach_trainer(self.trainer_id, lease_s=LEASE_S, **settings)
        except GatewayRefused as err:
            raise AttachError(str(err)) from None
        except GatewayAdminError as err:
            raise AttachError(str(err)) from None
        log.info("attached to the gateway at %s as trainer %s", self.url, self.trainer_id)

    async def register(self, child: Child) -> None:
        """A (re)started engine of the run takes the gateway's traffic."""
        if child not in self.own_engines:
            self.own_engines.append(child)
        assert child.url is not None
        await self.admin.attach_engine(child.url, backend=self.backend, owner=self.trainer_id)

    async def unregister(self, child: Child) -> None:
        """An engine of the run died: no call goes there until it is back."""
        if child.url is not None:
            await best_effort(self.admin.detach_engine(child.url, drain=False))

    def start_heartbeat(self, announce: Callable[[], Awaitable[None]]) -> None:
        """Renew the seat (an announce of the current version) every :data:`HEARTBEAT_S` s."""

        async def beat() -> None:
            while True:
                await asyncio.sleep(HEARTBEAT_S)
                await announce()

        self._heartbeat = asyncio.create_task(beat())

    async def announce(
        self, version: int, *, consumed: int, dropped: int, weights: str | None
    ) -> None:
        """The new version to the gateway's clock (and the seat's lease); a gateway that no longer
        knows this trainer (restarted, lease lapsed) is attached again with the run's totals."""
        call = self.admin.set_version(
            version, dropped=dropped, consumed=consumed, trainer_id=self.trainer_id, weights=weights
        )
        try:
            await call
        except GatewayRefused as err:
            if err.code != "trainer_not_attached":
                log.warning("%s", err)
                return
            log.warning("the gateway at %s lost this run's seat; taking it again", self.url)
            await self._retake(version, consumed=consumed, dropped=dropped, weights=weights)
        except GatewayAdminError as err:
            log.debug("ignored: %s", err)

    async def _retake(
        self, version: int, *, consumed: int, dropped: int, weights: str | None
    ) -> None:
        settings = {**self.settings, "version": version, "consumed": consumed, "dropped": dropped}
        try:
            await self.admin.attach_trainer(self.trainer_id, lease_s=LEASE_S, **settings)
            for child in self.own_engines:
                if child.up:
                    await self.register(child)
            await self.admin.set_version(
                version,
                dropped=dropped,
                consumed=consumed,
                trainer_id=self.trainer_id,
                weights=weights,
            )
        except GatewayAdminError as err:
            log.warning("could not take the seat again: %s", err)

    async def leave(self) -> None:
        """Give the seat back: the gateway detaches the run's engines and serves on (once)."""
        if self._left:
            return
        self._left = True
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
        left = await best_effort(self.admin.leave_trainer(self.trainer_id))
        if left is not None:
            log.info("left the gateway at %s (it serves on)", self.url)
