"""``litellm``: an agent written against LiteLLM (``litellm.completion`` / ``acompletion``) reaches
its episode's gateway session through the gateway's OpenAI route (``model="openai/<policy>"``, the
default) or its Anthropic route (``model="anthropic/<policy>"``, with ``protocol="anthropic"``).

The agent is handed a :class:`LiteLLMClient`, the episode's endpoint in LiteLLM's terms:
``client.model``, ``client.api_base``, ``client.api_key``; ``client.params`` holds all three (and
the adapter's call options) to spread into a call of the agent's own,
``litellm.acompletion(**client.params, messages=...)``, and ``client.completion(...)`` /
``await client.acompletion(...)`` call LiteLLM with them filled in. Code that names only the model
(``litellm.completion(model="openai/<policy>", ...)``) finds its own episode's ``OPENAI_BASE_URL``,
``OPENAI_API_KEY``, ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_KEY``, which LiteLLM reads at each
call: per-episode values, not process-wide variables (:mod:`areal.adapters.env`).

No retries (``max_retries=0`` in ``client.params``): a retry would be recorded as a turn. Other
options of the adapter go into every call through ``client.params`` (``timeout=30``, say).

Staying on the machine: LiteLLM downloads its model-price map from GitHub when it is imported, its
table of Anthropic beta headers on first use, and some tokenizers from Hugging Face, unless told to
use the copies it bundles. Those switches are read at import and in LiteLLM's own threads, where
per-episode values do not reach, so wrapping an agent sets them process-wide (a value already set is
kept) before the adapter first imports LiteLLM. An agent module that imports ``litellm`` itself
before it is wrapped has already tried the download: set ``LITELLM_LOCAL_MODEL_COST_MAP=True`` in
the environment (or in the module, before the import) first; the adapter warns when it finds LiteLLM
imported without it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from areal.adapters.base import AdapterError, LibraryAdapter
from areal.core.episode import Episode, gateway_root

INSTALL = "the litellm adapter needs LiteLLM: pip install litellm"
ProtocolName = Literal["openai", "anthropic"]
PROTOCOLS = ("openai", "anthropic")
# LiteLLM's switches for the bundled copies of what it otherwise downloads; LITELLM_OFFLINE_MODE
# covers all of them in recent versions, the other two older ones as well.
STAY_LOCAL = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
    "LITELLM_OFFLINE_MODE": "true",
}

log = logging.getLogger("areal.adapters.litellm")


@dataclass(frozen=True)
class LiteLLMClient:
    """One episode's gateway session as LiteLLM names it; the key stays out of ``repr``."""

    model: str  # "openai/<policy>" or "anthropic/<policy>": the prefix picks LiteLLM's provider
    api_base: str
    api_key: str = field(repr=False)
    options: Mapping[str, Any] = field(default_factory=dict)  # added to every call

    @property
    def params(self) -> dict[str, Any]:
        """``model``, ``api_base``, ``api_key`` and the call options, for ``litellm.completion``."""
        return {
            "model": self.model,
            "api_base": self.api_base,
            "api_key": self.api_key,
            **self.options,
        }

    def completion(self, **kwargs: Any) -> Any:
        """``litellm.completion`` with this episode's endpoint (``kwargs`` override it)."""
        return _litellm().completion(**{**self.params, **kwargs})

    async def acompletion(self, **kwargs: Any) -> Any:
        """``litellm.acompletion`` with this episode's endpoint (``kwargs`` override it)."""
        return await _litellm().acompletion(**{**self.params, **kwargs})


class LiteLLMAdapter(LibraryAdapter):
    framework = "litellm"

    def __init__(self, agent: Any, *, protocol: ProtocolName = "openai", **options: Any) -> None:
        if protocol not in PROTOCOLS:
            raise AdapterError(f"protocol must be 'openai' or 'anthropic', got {protocol!r}")
        stay_local()
        _litellm()  # fail at wrap time, not in every episode
        super().__init__(agent, **options)
        self.protocol = protocol

    def base_url(self, episode: Episode) -> str:
        # LiteLLM's Anthropic provider adds /v1/messages itself.
        if self.protocol == "anthropic":
            return gateway_root(episode.base_url)
        return episode.base_url

    def environment(self, episode: Episode) -> dict[str, str]:
        # Both providers', so a call naming either model prefix reaches the episode; the auth
        # token too, or LiteLLM could send a machine's ANTHROPIC_AUTH_TOKEN.
        root, key = gateway_root(episode.base_url), episode.api_key
        return {
            "OPENAI_BASE_URL": episode.base_url,
            "OPENAI_API_BASE": episode.base_url,
            "OPENAI_API_KEY": key,
            "ANTHROPIC_BASE_URL": root,
            "ANTHROPIC_API_BASE": root,
            "ANTHROPIC_API_KEY": key,
            "ANTHROPIC_AUTH_TOKEN": key,
        }

    def client(self, episode: Episode) -> LiteLLMClient:
        return LiteLLMClient(
            model=f"{self.protocol}/{episode.model}",
            api_base=self.base_url(episode),
            api_key=episode.api_key,
            options={"max_retries": 0, **self.options},
        )

    def async_client(self, episode: Episode) -> LiteLLMClient:
        return self.client(episode)

    def sync_client(self, episode: Episode) -> LiteLLMClient:
        return self.client(episode)

    async def close_async(self, client: Any) -> None:
        return None  # LiteLLM keeps its own HTTP clients

    def close_sync(self, client: Any) -> None:
        return None


def stay_local() -> None:
    """Turn on LiteLLM's bundled copies process-wide (values already set are kept)."""
    unset = [name for name in STAY_LOCAL if name not in os.environ]
    if "litellm" in sys.modules and {"LITELLM_LOCAL_MODEL_COST_MAP", "LITELLM_OFFLINE_MODE"} <= set(
        unset
    ):
        log.warning(
            "litellm was imported before LITELLM_LOCAL_MODEL_COST_MAP was set: its import tried "
            "to download LiteLLM's model-price map from GitHub. Set LITELLM_LOCAL_MODEL_COST_MAP="
            "True in the environment (or before `import litellm`) to keep it on this machine."
        )
    for name in unset:
        os.environ[name] = STAY_LOCAL[name]


def _litellm() -> Any:
    try:
        import litellm
    except ImportError as err:
        raise AdapterError(INSTALL) from err
    return litellm
