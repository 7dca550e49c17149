"""``openai_sdk``: an agent written against the ``openai`` SDK gets a client bound to its episode.

An async agent gets ``episode.openai_client()`` (an ``AsyncOpenAI`` on the process's shared HTTP
pool), a sync one an ``OpenAI`` built for the episode and run in a worker thread. Code that builds
its own client (``AsyncOpenAI()`` without arguments) finds ``OPENAI_BASE_URL`` and
``OPENAI_API_KEY`` of its own episode: they are per-episode context values, not process-wide
variables (:mod:`areal.adapters.env`). Neither client retries: a retry would be recorded as a turn.
"""

from __future__ import annotations

from typing import Any

from areal.adapters.base import LibraryAdapter
from areal.core.episode import Episode


class OpenAIAdapter(LibraryAdapter):
    framework = "openai_sdk"

    def environment(self, episode: Episode) -> dict[str, str]:
        return {"OPENAI_BASE_URL": episode.base_url, "OPENAI_API_KEY": episode.api_key}

    def async_client(self, episode: Episode) -> Any:
        return episode.openai_client(**self.options)

    def sync_client(self, episode: Episode) -> Any:
        import openai

        options = {"max_retries": 0, **self.options}
        return openai.OpenAI(base_url=episode.base_url, api_key=episode.api_key, **options)
