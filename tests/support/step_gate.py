"""A vLLM engine held between its steps, for tests that act while a request runs.

vLLM's API server relays tokens behind its engine by a margin no client can see, so a test that
aborts or pauses "while the request runs" cannot know from the stream that the engine has not
already finished. areal's worker extension has a step gate (``areal_step_gate``): armed with two
named pipes, every engine step that runs the model takes one byte from the first (a release) and
writes one to the second when it is done. A test lets the engine make exactly ``k`` steps, knows
when it made them, acts, and then lets it on one step at a time until the act took effect.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx

OPEN = b"o"  # opens the gate for good (the worker extension's ``OPEN``)


class StepGate:
    """The test's ends of an armed step gate. ``timeout``: how long a released step may take
    before the test fails saying so (a bound for a broken engine, not a premise)."""

    def __init__(self, url: str, directory: Path, timeout: float = 120.0) -> None:
        release, done = directory / "release-steps", directory / "steps-done"
        os.mkfifo(release)
        os.mkfifo(done)
        # O_RDWR: neither open waits for the engine's end; the done end never blocks a read.
        self._release = os.open(release, os.O_RDWR)
        self._done = os.open(done, os.O_RDWR | os.O_NONBLOCK)
        self.timeout = timeout
        self.made = 0  # steps the engine made through this gate
        answer = httpx.post(
            url + "/collective_rpc",
            json={
                "method": "areal_step_gate",
                "kwargs": {"release_path": str(release), "done_path": str(done)},
            },
            timeout=60,
        )
        answer.raise_for_status()

    async def release(self, steps: int = 1) -> None:
        """Let ``steps`` engine steps run, and return once they have."""
        os.write(self._release, b"1" * steps)
        try:
            await asyncio.wait_for(self._made(steps), self.timeout)
        except TimeoutError:
            raise AssertionError(
                f"vLLM's engine did not make the {steps} steps released within {self.timeout}s "
                f"({self.made} made through the gate so far)"
            ) from None

    async def release_until(self, done: asyncio.Future[object], most: int) -> int:
        """Let the engine on one step at a time until ``done`` is (an act reached it between two
        steps); returns how many steps that took. An engine left with nothing to run takes no
        step: ``done`` is watched while each step is awaited."""
        for made in range(most):
            if done.done():
                return made
            os.write(self._release, b"1")
            step = asyncio.ensure_future(self._made(1))
            await asyncio.wait({step, done}, timeout=self.timeout, return_when="FIRST_COMPLETED")
            if not step.done():
                step.cancel()
                if not done.done():
                    raise AssertionError(f"vLLM's engine made no step within {self.timeout}s")
        if not done.done():
            raise AssertionError(f"{most} engine steps went by and what was awaited never came")
        return most

    def open(self) -> None:
        """Let the engine run freely from now on (idempotent; safe whatever it is doing)."""
        os.write(self._release, OPEN)

    def close(self) -> None:
        self.open()
        os.close(self._release)
        os.close(self._done)

    async def _made(self, steps: int) -> None:
        loop = asyncio.get_running_loop()
        wanted = self.made + steps
        while self.made < wanted:
            try:
                self.made += len(os.read(self._done, wanted - self.made))
                continue
            except BlockingIOError:
                pass
            readable: asyncio.Future[None] = loop.create_future()
            loop.add_reader(self._done, _settle, readable)
            try:
                await readable
            finally:
                loop.remove_reader(self._done)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
