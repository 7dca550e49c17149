"""One thread for every call into the training engine, so its steps run where its memory is.

``asyncio.to_thread`` hands each call to whichever thread of the loop's default pool is idle,
and the pool grows while other work (the trajectory queue's waits) holds a thread, so train steps
wander between threads. Each thread allocates from its own glibc arena and keeps its own BLAS and
oneDNN buffers: the memory one step freed is not where the next step on another thread looks,
and that step faults fresh zeroed pages in. Measured here (``small`` model, batches of 32, one
torch thread): steps taking turns on 3 threads ran 1,066 ms per 1k tokens with 20k page faults a
step; the same steps on one thread 936 ms with 5.5k (``docs/training.md``, "The trainer's
thread"). Calls wait their turn, in order: the engine is not thread-safe anyway.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

THREAD_NAME = "areal-trainer"


def with_thread_cpu(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> tuple[T, float]:
    """``fn(*args, **kwargs)`` and the CPU seconds the calling thread spent in it: a step whose
    CPU time falls well short of its wall time waited (for the GIL, another rank, the host)."""
    started = time.thread_time()
    result = fn(*args, **kwargs)
    return result, time.thread_time() - started


class TrainerThread:
    """``await trainer.run(fn, *args)``: ``asyncio.to_thread`` on one named, lasting thread.

    The thread starts on the first call and inherits the CPU affinity of the thread making it
    (the run pins its own thread to ``train.cpu_affinity`` first)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_NAME)

    async def run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on the trainer's thread, with the caller's context vars."""
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def close(self) -> None:
        """No more calls; a call still running finishes on its own (as with ``to_thread``)."""
        self._pool.shutdown(wait=False)
