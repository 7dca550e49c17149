"""Waiting for an event, never for a time: the suite's one polling loop.

A test that must wait for something the product does in the background (a server up, a file
written, a session reaped) asks :func:`eventually` for it. The timeout is a ceiling for a
machine that stopped, not a guess at how fast this one is: it is generous, and a test that
passes waits only as long as the event takes. When it runs out, the error says what was
awaited and what the predicate last answered or raised, so a failure in CI explains itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

FIRST_POLL_S = 0.005  # the first re-check comes soon: most events are already on their way
MAX_POLL_S = 0.2  # and the polls back off to this, so a long wait costs the machine nothing


class NeverHappened(AssertionError):
    """What :func:`eventually` raises: the awaited event did not happen within the timeout."""


def eventually(predicate: Callable[[], T], timeout: float, what: str) -> T:
    """Call ``predicate`` until it returns something truthy, and return that.

    An exception from ``predicate`` counts as "not yet" (a server not listening yet refuses the
    connection) and is named in the failure if the time runs out.
    """
    deadline = time.monotonic() + timeout
    poll = FIRST_POLL_S
    while True:
        last = _attempt(predicate)
        if not isinstance(last, _Failed) and last:
            return last
        if time.monotonic() >= deadline:
            raise NeverHappened(_message(what, timeout, last))
        time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
        poll = min(poll * 2, MAX_POLL_S)


async def eventually_async(
    predicate: Callable[[], Awaitable[T]] | Callable[[], T], timeout: float, what: str
) -> T:
    """:func:`eventually` on an event loop: ``predicate`` may be a coroutine function, and the
    loop keeps running between the checks."""
    deadline = time.monotonic() + timeout
    poll = FIRST_POLL_S
    while True:
        try:
            value = predicate()
            last = await value if asyncio.iscoroutine(value) else value
        except Exception as exc:
            last = _Failed(exc)
        if not isinstance(last, _Failed) and last:
            return last  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise NeverHappened(_message(what, timeout, last))
        await asyncio.sleep(min(poll, max(0.0, deadline - time.monotonic())))
        poll = min(poll * 2, MAX_POLL_S)


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __repr__(self) -> str:
        return f"raised {type(self.exc).__name__}: {self.exc}"


def _attempt(predicate: Callable[[], T]) -> T | _Failed:
    try:
        return predicate()
    except Exception as exc:
        return _Failed(exc)


def _message(what: str, timeout: float, last: object) -> str:
    said = repr(last) if isinstance(last, _Failed) else f"last answered {last!r}"
    return f"waited {timeout:g} s for {what}; it never happened ({said})"
