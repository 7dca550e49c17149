"""Per-episode ``OPENAI_*`` / ``ANTHROPIC_*`` variables for agents that build their own client.

Environment variables are process-wide, but a rollout worker runs many episodes at once, each with
its own session key. Setting ``os.environ`` per episode would hand one episode's key to another.
Instead the values live in a :class:`~contextvars.ContextVar` (each episode runs in its own asyncio
task, and ``asyncio.to_thread`` carries the context into a sync agent's thread), and reads through
``os.environ`` / ``os.getenv`` consult it first. Limits: only reads through ``os.environ`` see the
overlay; a child process started without an explicit ``env`` inherits the real environment, and
threads the agent starts itself (other than through ``asyncio.to_thread`` or ``contextvars``) do
not see it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

_OVERLAY: ContextVar[Mapping[str, str] | None] = ContextVar("areal_episode_env", default=None)


class _EpisodeEnviron(os._Environ[str]):
    """``os.environ``, with the current episode's variables shadowing the process's."""

    def __getitem__(self, key: str) -> str:
        overlay = _OVERLAY.get()
        if overlay is not None and key in overlay:
            return overlay[key]
        return super().__getitem__(key)


def _install() -> None:
    if not isinstance(os.environ, _EpisodeEnviron):
        os.environ.__class__ = _EpisodeEnviron  # same layout: only lookups change


@contextmanager
def episode_env(values: Mapping[str, str]) -> Iterator[None]:
    """Within this block (and tasks/threads started from it), ``os.environ`` shows ``values``."""
    _install()
    token = _OVERLAY.set({**(_OVERLAY.get() or {}), **values})
    try:
        yield
    finally:
        _OVERLAY.reset(token)
