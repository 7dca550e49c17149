"""``dspy``: DSPy programs run against their episode's gateway session through a ``dspy.LM`` bound
to it.

The agent is a function ``(task, lm, **extras)`` (or an object with ``run(task, **kw)``), sync or
async. It runs inside ``dspy.context(lm=lm)``, so the DSPy modules it calls (``dspy.Predict``,
``ChainOfThought``, ``ReActV2``, ``streamify``...) use the episode's LM without being handed it,
and concurrent episodes never share one: ``dspy.context`` is a context variable, seen by the
episode's own task and by the thread a sync agent runs in. A module given an LM of its own
(``Predict(..., lm=...)``, ``set_lm``) bypasses the episode's.

The LM is ``dspy.LM("openai/<policy>", api_base=<the episode's /v1>, api_key=<session key>)``
with ``cache=False`` (a cached answer never reaches the policy: no turn, nothing to train) and
``num_retries=0`` (a retry would be recorded as a turn). DSPy knows what a model supports only for
the models of its catalog; this LM says what the gateway serves for any model, native function
calling and ``response_format`` json_schema, so ``dspy.JSONAdapter`` asks for structured output
and adapters with ``use_native_function_calling`` send ``tools``. Other options go to ``dspy.LM``
(``max_tokens``, ``temperature``, ``engine="litellm"``...): DSPy calls the gateway with its own
native engine by default, through LiteLLM with ``engine="litellm"`` (or when the machine sets
``OPENAI_BASE_URL``, which is why the episode's environment does not). What the agent returns is
the episode's result; a ``dspy.Prediction`` becomes its ``answer`` field, or all its fields as JSON.

Staying on the machine: DSPy (for model metadata and prices, on first use) and LiteLLM (at import)
download LiteLLM's model-price map from GitHub unless ``LITELLM_LOCAL_MODEL_COST_MAP`` is true;
wrapping an agent sets it and LiteLLM's other local-copy switches process-wide (values already set
are kept), as the ``litellm`` adapter does.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Mapping
from typing import Any

from areal.adapters.base import AdapterError, LibraryAdapter, Result, bind, call_agent
from areal.adapters.litellm import stay_local
from areal.core.episode import Episode

INSTALL = "the dspy adapter needs DSPy: pip install 'areal[dspy]'"
# What the gateway serves for any model, beyond what DSPy's native OpenAI mapping always sends.
GATEWAY_PARAMS = frozenset({"response_format", "tools", "tool_choice", "parallel_tool_calls"})


class DSPyAdapter(LibraryAdapter):
    framework = "dspy"

    def __init__(self, agent: Any, **options: Any) -> None:
        stay_local()  # before DSPy first reads the switch, or LiteLLM is imported
        _dspy()  # fail at wrap time, not in every episode
        super().__init__(agent, **options)

    def lm(self, episode: Episode) -> Any:
        """The episode's ``dspy.LM``: the policy on the episode's session, no cache, no retries."""
        options = {"cache": False, "num_retries": 0, **self.options}
        return _gateway_lm()(
            f"openai/{episode.model}", api_base=episode.base_url, api_key=episode.api_key, **options
        )

    async def agent_fn(self, episode: Episode) -> Result:
        dspy = _dspy()
        extras = self.extras(episode)
        lm = self.lm(episode)
        try:
            with dspy.context(lm=lm):  # a context variable: to_thread carries it to the thread
                if self.is_async:
                    out = await call_agent(self.target, episode.task, lm, extras)
                else:
                    out = await asyncio.to_thread(self._call_sync, episode.task, lm, extras)
        finally:
            await lm.aclose()  # this loop's connection pools and the sync ones
        return self.result(out)

    def _call_sync(self, task: Any, lm: Any, extras: dict[str, Any]) -> Any:
        args, kwargs = bind(self.target, task, lm, extras)
        return self.target(*args, **kwargs)

    def result(self, out: Any) -> Result:
        """What the agent returned; a ``Prediction`` as its ``answer``, or its fields as JSON."""
        dspy = _dspy()
        if isinstance(out, dspy.Prediction):
            fields = dict(out.items())
            if "answer" in fields:
                return str(fields["answer"])
            return json.dumps(fields, default=str)
        if isinstance(out, Mapping | list):
            return json.dumps(out, default=str)
        return out  # type: ignore[no-any-return]


@functools.cache
def _gateway_lm() -> type:
    """``dspy.LM`` with the gateway's capabilities, built on first use (DSPy imports lazily)."""
    base: Any = _dspy().LM

    class GatewayLM(base):
        """A ``dspy.LM`` served by the gateway: tools and json_schema for any model."""

        @property
        def supports_function_calling(self) -> bool:
            return True

        @property
        def supports_response_schema(self) -> bool:
            return True

        @property
        def supported_params(self) -> set[str]:
            return set(super().supported_params) | GATEWAY_PARAMS

    return GatewayLM


def _dspy() -> Any:
    try:
        import dspy
    except ImportError as err:
        raise AdapterError(INSTALL) from err
    return dspy
