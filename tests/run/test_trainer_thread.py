"""The trainer's thread: every engine call on one lasting thread, whatever else holds the loop's
default pool (the queue's waits do, and with them ``asyncio.to_thread`` moved steps around)."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from areal.run.trainer_thread import THREAD_NAME, TrainerThread

WHO = contextvars.ContextVar("who", default="nobody")


def test_every_call_runs_on_one_named_thread_while_the_default_pool_is_busy() -> None:
    release = threading.Event()

    async def scenario() -> list[str]:
        trainer = TrainerThread()
        # Threads of the default pool held by blocking waits, as the queue's ``aget`` holds them.
        waits = [asyncio.create_task(asyncio.to_thread(release.wait, 10)) for _ in range(3)]
        names = [await trainer.run(lambda: threading.current_thread().name) for _ in range(6)]
        release.set()
        await asyncio.gather(*waits)
        # Interleaved with more default-pool work: still the same thread.
        for _ in range(4):
            await asyncio.to_thread(lambda: None)
            names.append(await trainer.run(lambda: threading.current_thread().name))
        trainer.close()
        return names

    names = asyncio.run(scenario())
    assert len(set(names)) == 1
    assert names[0].startswith(THREAD_NAME)
    assert names[0] != threading.current_thread().name


def test_results_errors_arguments_and_context_reach_the_caller() -> None:
    def describe(a: int, *, b: int) -> str:
        return f"{WHO.get()}:{a + b}"

    def fail() -> None:
        raise ValueError("the step failed")

    async def scenario() -> str:
        trainer = TrainerThread()
        WHO.set("the run")
        try:
            with pytest.raises(ValueError, match="the step failed"):
                await trainer.run(fail)
            return await trainer.run(describe, 1, b=2)  # the thread survives an error
        finally:
            trainer.close()

    assert asyncio.run(scenario()) == "the run:3"


def test_calls_run_one_at_a_time_in_the_order_made() -> None:
    """One at a time because on one thread: a thread runs one call until it returns."""
    order: list[int] = []
    threads: set[int] = set()
    inside = 0
    most = 0
    lock = threading.Lock()

    def call(i: int) -> None:
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        threads.add(threading.get_ident())
        order.append(i)
        with lock:
            inside -= 1

    async def scenario() -> None:
        trainer = TrainerThread()
        await asyncio.gather(*(trainer.run(call, i) for i in range(8)))
        trainer.close()

    asyncio.run(scenario())
    assert order == list(range(8))
    assert most == 1 and len(threads) == 1
