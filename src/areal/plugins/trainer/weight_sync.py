"""Weight sync: after each trainer step, every inference engine serves the new weights.

:class:`DiskWeightSync` goes through the file system, which works with any engine that speaks the
SGLang API (the embedded one or real SGLang) and needs no shared process group:

1. **save**: the model's weights as safetensors into ``out_dir/v{version}``. They are written to a
   temporary sibling and renamed, so an engine never reads a half-written checkpoint.
2. **pause**: ``/pause_generation`` on every engine, with ``pause_mode``: ``retract`` (default)
   sends in-flight sequences back to the queue with their partial output, to be prefilled again
   and resumed on the new weights (interruptible generation: exact, but each update costs the
   engine a prefill of everything in flight); ``in_place`` keeps their KV caches and goes on with
   the new weights (cheap; the tokens after the switch attend to keys and values of the previous
   weights). Either way their ``weight_versions`` record the switch. With packed prefill the
   re-prefill costs a CPU engine a fraction of a second per update, and the trainer, not the
   engine, bounds an async run (bench/async_vs_sync.py, docs/benchmarks.md).
3. **update**: ``/update_weights_from_disk`` with ``weight_version=str(version)`` on every engine.
4. **continue**: ``/continue_generation`` on every engine.

Phase 1 is the only one that reads the model: :meth:`DiskWeightSync.save` and
:meth:`DiskWeightSync.deliver` are the two halves, so an async run's loop can let the engines
load a version while its next step trains (``async.overlap_sync``).

Each phase has a timeout (the watchdog); a failure or a timeout raises :class:`WeightSyncError`
naming the phase and the engine. After a failed pause or update the engines are still sent
``continue`` (best effort) so they do not stay paused while the caller decides what to do. Old
version directories are deleted, keeping the newest ``keep``.

:class:`WeightSync` is the seam: :class:`~areal.plugins.trainer.collective_sync.CollectiveWeightSync`
broadcasts the weights to the engines instead (``inference.weight_sync: collective``).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from areal.core.engine_client import EngineClient, engine_client
from areal.core.inference_records import InferenceError, PauseMode
from areal.core.train_engine import WeightSyncError
from areal.core.types import version_number
from areal.plugins.models.decoder import DecoderForCausalLM
from areal.plugins.models.hf_io import save_model

__all__ = ["DiskWeightSync", "EngineCalls", "WeightSync", "WeightSyncError"]

_VERSION_DIR = re.compile(r"^v(\d+)$")


class WeightSync(Protocol):
    """Makes the engines serve ``model``'s weights as ``version``; returns the seconds it took."""

    async def publish(self, model: DecoderForCausalLM, version: int) -> float: ...

    async def close(self) -> None: ...


class EngineCalls:
    """What every weight sync does to the engines: the same call on all of them at once, each
    phase under its own timeout (the watchdog), failures named by phase and engine."""

    def __init__(
        self,
        engine_urls: Sequence[str],
        *,
        timeouts: dict[str, float],
        pause_mode: PauseMode = "retract",
        engine_backend: str | None = None,
    ) -> None:
        self.engine_urls = [u.rstrip("/") for u in engine_urls]
        if pause_mode not in ("retract", "in_place"):
            raise ValueError(f"pause_mode must be retract or in_place; got {pause_mode!r}")
        self.pause_mode: PauseMode = pause_mode
        self.timeouts = dict(timeouts)
        self.engine_backend = engine_backend  # the registered backend whose client to use
        self._clients: dict[str, EngineClient] = {}
        # Seconds of each phase of the last publish, for the live monitor.
        self.last_phases: dict[str, float] = {}

    def _client(self, url: str) -> EngineClient:
        if url not in self._clients:
            self._clients[url] = engine_client(self.engine_backend, url, timeout=None)
        return self._clients[url]

    async def close(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()

    async def _pause_all(self) -> None:
        await self._on_all("pause", lambda c: c.pause_generation(mode=self.pause_mode))

    async def _continue_all(self) -> None:
        await self._on_all("continue", lambda c: c.continue_generation())

    async def _on_all(
        self, phase: str, call: Callable[[EngineClient], Awaitable[dict[str, Any]]]
    ) -> None:
        """Run ``call`` on every engine at once; the first failure (in URL order) is raised."""
        results = await asyncio.gather(
            *(self._one(phase, url, call) for url in self.engine_urls), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _one(
        self, phase: str, url: str, call: Callable[[EngineClient], Awaitable[dict[str, Any]]]
    ) -> None:
        timeout = self.timeouts[phase]
        try:
            await asyncio.wait_for(call(self._client(url)), timeout)
        except TimeoutError as exc:
            raise WeightSyncError(
                phase, url, f"no answer within {timeout:g} s", stalled=True
            ) from exc
        except InferenceError as exc:
            raise WeightSyncError(phase, url, str(exc)) from exc

    async def _resume_quietly(self, failed: WeightSyncError | None = None) -> None:
        """After a failed pause/update: try to un-pause every engine, ignoring failures; an
        engine that stalled (``failed``) is not waited for a second time."""
        skip = failed.url if failed is not None and failed.stalled else None
        await asyncio.gather(
            *(
                self._one("continue", url, lambda c: c.continue_generation())
                for url in self.engine_urls
                if url != skip
            ),
            return_exceptions=True,
        )


class DiskWeightSync(EngineCalls):
    """Weight sync through safetensors on a shared file system (see the module docstring)."""

    def __init__(
        self,
        engine_urls: Sequence[str],
        out_dir: str | Path,
        *,
        keep: int = 2,
        save_timeout: float = 300.0,
        pause_timeout: float = 60.0,
        update_timeout: float = 300.0,
        continue_timeout: float = 60.0,
        pause_mode: PauseMode = "retract",
        engine_backend: str | None = None,
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1; got {keep}")
        timeouts = {
            "save": save_timeout,
            "pause": pause_timeout,
            "update": update_timeout,
            "continue": continue_timeout,
        }
        super().__init__(
            engine_urls, timeouts=timeouts, pause_mode=pause_mode, engine_backend=engine_backend
        )
        self.out_dir = Path(out_dir)
        self.keep = keep
        self._saved_s = 0.0  # the last save's seconds, for ``last_phases``

    def version_dir(self, version: int) -> Path:
        return self.out_dir / f"v{version}"

    async def catch_up(self, url: str, version: int) -> None:
        """A (re)started engine behind ``version`` loads that version's weights from disk; one
        that cannot be told its version at launch (vLLM starts as ``default``) is labelled."""
        latest = self.version_dir(version)
        client = engine_client(self.engine_backend, url, timeout=self.timeouts["update"])
        try:
            have = (await client.model_info()).get("weight_version")
            if version and latest.is_dir() and version_number(have) < version:
                await client.update_weights_from_disk(str(latest), weight_version=str(version))
            elif str(have) != str(version):
                await client.update_weight_version(str(version), abort_all_requests=False)
        finally:
            await client.aclose()

    async def publish(self, model: DecoderForCausalLM, version: int) -> float:
        """Save, pause, update, continue (module docstring); the seconds the whole sync took."""
        return await self.save(model, version) + await self.deliver(version)

    async def save(self, model: DecoderForCausalLM, version: int) -> float:
        """The first half of :meth:`publish`, the only one that reads ``model``: once it returns,
        the trainer may change the weights (the next step) while :meth:`deliver` runs."""
        start = time.perf_counter()
        await self._save(model, version)
        self._saved_s = time.perf_counter() - start
        return self._saved_s

    async def deliver(self, version: int) -> float:
        """The second half of :meth:`publish`: pause, update from ``version``'s saved directory,
        continue; the seconds it took."""
        path = self.version_dir(version)
        start = time.perf_counter()
        try:
            await self._pause_all()
            paused = time.perf_counter()
            await self._on_all(
                "update",
                lambda c: c.update_weights_from_disk(str(path), weight_version=str(version)),
            )
            updated = time.perf_counter()
        except WeightSyncError as err:
            await self._resume_quietly(err)
            raise
        await self._continue_all()
        self.last_phases = {
            "save": self._saved_s,
            "pause": paused - start,
            "update": updated - paused,
            "continue": time.perf_counter() - updated,
        }
        self._prune()
        return time.perf_counter() - start

    async def _save(self, model: DecoderForCausalLM, version: int) -> Path:
        final = self.version_dir(version)
        tmp = self.out_dir / f".v{version}.tmp"

        def write() -> None:
            shutil.rmtree(tmp, ignore_errors=True)
            save_model(model, tmp)
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)  # atomic on one file system: the engine sees all or nothing

        try:
            # The thread cannot be killed on a timeout; the watchdog still frees the trainer.
            await asyncio.wait_for(asyncio.to_thread(write), self.timeouts["save"])
        except TimeoutError as exc:
            raise WeightSyncError(
                "save", None, f"writing {final} took over {self.timeouts['save']:g} s"
            ) from exc
        except OSError as exc:
            raise WeightSyncError("save", None, f"writing {final}: {exc}") from exc
        return final

    def _prune(self) -> None:
        """Delete all version directories but the newest ``keep``."""
        found = sorted(
            (int(m.group(1)), p)
            for p in self.out_dir.iterdir()
            if p.is_dir() and (m := _VERSION_DIR.match(p.name))
        )
        for _, path in found[: -self.keep]:
            shutil.rmtree(path, ignore_errors=True)
