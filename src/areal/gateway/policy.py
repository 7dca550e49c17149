"""The policy as the gateway sees it: the chat template, the engines, token-exact generations.

Prompts are rendered with the policy tokenizer's chat template and tokenized here; the output
tokens, log-probs and per-token versions are taken from the engine as generated, never
re-tokenized. Engines are picked round-robin, or sticky per session (the same conversation keeps
landing on the engine that holds its prefix).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import zlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from areal.core.engine_client import engine_client
from areal.core.inference_client import GenerateOutput, InferenceError, UnknownTokenVersionsError
from areal.core.plugins import registry
from areal.core.tool_calls import ToolCallParser
from areal.core.types import sampling_record, version_number
from areal.gateway.errors import GatewayError
from areal.gateway.router_config import ModelRoute

DEFAULT_ALIASES = ("default",)

log = logging.getLogger("areal.gateway.policy")


@dataclass
class Generation:
    """What one policy call produced (cumulative while streaming; ``finished`` at the end)."""

    text: str
    output_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    prompt_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    matched_stop: Any = None
    engine: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)  # types.sampling_record of the call

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @classmethod
    def from_output(
        cls,
        out: GenerateOutput,
        prompt_ids: list[int],
        engine: str,
        sampling: dict[str, Any] | None = None,
    ) -> Generation:
        try:
            labels = out.token_versions(default=out.weight_version)
        except UnknownTokenVersionsError as err:  # never train on guessed versions
            raise GatewayError(
                502, f"the inference engine at {engine} cannot be trained on: {err}"
            ) from None
        versions = [version_number(v) for v in labels]
        reason = out.finish_reason
        return cls(
            text=out.text or "",
            output_ids=list(out.output_ids),
            logprobs=list(out.output_logprobs),
            versions=versions,
            prompt_ids=prompt_ids,
            finish_reason=reason.type if reason else None,
            matched_stop=reason.matched if reason else None,
            engine=engine,
            meta=out.meta_info,
            sampling=sampling_record(sampling or {}),
        )


DEFAULT_TOOL_PARSER = "hermes"  # the tool-call format of the built-in chat template


class PolicyService:
    """Renders chats for the policy and runs them on its engines."""

    def __init__(
        self,
        engines: Sequence[str],
        route: ModelRoute,
        *,
        tokenizer_path: str | None = None,
        context_length: int | None = None,
        aliases: Sequence[str] = DEFAULT_ALIASES,
        tool_parser: str | None = None,
        engine_backend: str | None = None,
    ) -> None:
        if not engines:
            raise ValueError(
                "the gateway needs at least one inference engine (--engine URL or --model DIR)"
            )
        self.route = route
        self.engine_urls = list(engines)
        self.clients = [engine_client(engine_backend, url) for url in self.engine_urls]
        self.tokenizer_path = tokenizer_path
        self.context_length = context_length
        self.aliases = tuple(aliases)
        self.tokenizer: Any = None
        self._round_robin = itertools.cycle(range(len(self.clients)))
        self._noted: set[tuple[str, Any]] = set()  # client sampling values logged as overridden
        parser = tool_parser or route.tool_parser or DEFAULT_TOOL_PARSER
        self.tool_parser: ToolCallParser = registry("tool_parsers").get(
            parser, key="model_routing.policy_model.tool_parser"
        )()

    @property
    def model_id(self) -> str:
        return self.route.model_id

    def serves(self, model: str | None) -> bool:
        """Is ``model`` the policy? (Clients may also say ``default``, or nothing.)"""
        return not model or model == self.model_id or model in self.aliases

    async def start(self) -> None:
        """Ask the first engine for its tokenizer and context length, and load the tokenizer."""
        info = await self._call(0, self.clients[0].model_info())
        self.tokenizer_path = (
            self.tokenizer_path or info.get("tokenizer_path") or info.get("model_path")
        )
        self.context_length = (
            self.context_length or info.get("context_length") or info.get("max_context_length")
        )
        if not self.tokenizer_path:
            raise ValueError("the engine does not say where its tokenizer is: pass --tokenizer DIR")
        self.tokenizer = await asyncio.to_thread(_load_tokenizer, self.tokenizer_path)

    async def close(self) -> None:
        for client in self.clients:
            await client.aclose()

    # --- prompts ----------------------------------------------------------------------------

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        prefix: str = "",
        *,
        history: Sequence[int] | None = None,
    ) -> list[int]:
        """Prompt token ids for an OpenAI-shaped chat (plus a forced ``prefix`` of the reply).

        ``history``: the tokens of the episode so far (its last call's prompt and output). When
        the rendered chat's text starts with exactly their text, the prompt reuses those tokens
        and only the new text is tokenized: a generated output that does not survive decode ->
        re-encode (a character split across tokens, runs of newlines the tokenizer would merge,
        tokens at the prompt/output boundary) then still extends the episode token for token, so
        the turns merge into one sample and the engine reuses its cached prefix. Text that differs
        (an agent that edited history, a template that re-renders past turns) falls back to
        tokenizing the whole chat.
        """
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools or None, tokenize=False, add_generation_prompt=True
            )
        except Exception as err:  # template errors are the client's (bad roles, content parts)
            raise GatewayError(
                400, f"messages cannot be rendered with the policy's chat template: {err}"
            ) from None
        text = str(text) + prefix
        if history:
            head = self.tokenizer.decode(list(history), clean_up_tokenization_spaces=False)
            if head and text.startswith(head):
                rest: list[int] = self.tokenizer.encode(text[len(head) :], add_special_tokens=False)
                return list(history) + rest
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False)
        return ids

    def sampling(
        self,
        prompt_len: int,
        *,
        max_tokens: int | None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: list[str] | None = None,
        seed: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """SGLang sampling params: the route's defaults, the client's values, and the caps.

        ``max_tokens`` is clamped (never refused) to the route's cap and to what the context has
        left; a prompt that leaves no room at all is a 400. A route with
        ``override_client_sampling`` (a training run's policy, by default) keeps its own
        temperature and top-p and drops a client's top-k and min-p, so every episode of a GRPO
        group is sampled alike; what it replaced is logged.
        """
        if self.route.override_client_sampling:
            temperature, top_p, extra = self._overridden(temperature, top_p, extra)
        limit = self.context_length or 0
        if limit and prompt_len >= limit:
            raise GatewayError(
                400,
                f"the prompt is {prompt_len} tokens; the policy's context is {limit} tokens",
                param="messages",
                code="context_length_exceeded",
            )
        budget = max_tokens or self.route.max_tokens or 1024
        if self.route.max_tokens:
            budget = min(budget, self.route.max_tokens)
        if limit:
            budget = min(budget, limit - prompt_len)
        params: dict[str, Any] = {"max_new_tokens": budget}
        temp = temperature if temperature is not None else self.route.temperature
        if temp is not None:
            params["temperature"] = temp
        p = top_p if top_p is not None else self.route.top_p
        if p is not None:
            params["top_p"] = p
        if stop:
            params["stop"] = stop
        if seed is not None:
            params["sampling_seed"] = seed
        params.update(extra or {})
        return params

    def _overridden(
        self, temperature: float | None, top_p: float | None, extra: dict[str, Any] | None
    ) -> tuple[None, None, dict[str, Any]]:
        """The client's sampling values dropped (the route's apply), each distinct one logged."""
        kept = dict(extra or {})
        client = {"temperature": temperature, "top_p": top_p}
        client.update({key: kept.pop(key) for key in ("top_k", "min_p") if key in kept})
        route = {"temperature": self.route.temperature, "top_p": self.route.top_p}
        for key, value in client.items():
            if value is not None and value != route.get(key) and (key, value) not in self._noted:
                self._noted.add((key, value))
                log.info(
                    "a client asked for %s=%s; the run's sampling applies (%s)",
                    key,
                    value,
                    route.get(key, "off"),
                )
        return None, None, kept

    # --- generation -------------------------------------------------------------------------

    def pick(self, sticky: str | None) -> int:
        if sticky is None or len(self.clients) == 1:
            return next(self._round_robin)
        return zlib.crc32(sticky.encode()) % len(self.clients)

    async def generate(
        self, prompt_ids: list[int], sampling: dict[str, Any], *, sticky: str | None = None
    ) -> Generation:
        i = self.pick(sticky)
        out = await self._call(
            i, self.clients[i].generate(input_ids=prompt_ids, sampling_params=sampling)
        )
        return Generation.from_output(out, prompt_ids, self.engine_urls[i], sampling)

    async def stream(
        self, prompt_ids: list[int], sampling: dict[str, Any], *, sticky: str | None = None
    ) -> AsyncIterator[Generation]:
        """Cumulative generations as the engine produces tokens; the last one is finished."""
        i = self.pick(sticky)
        try:
            async for out in self.clients[i].generate_stream(
                input_ids=prompt_ids, sampling_params=sampling
            ):
                yield Generation.from_output(out, prompt_ids, self.engine_urls[i], sampling)
        except InferenceError as err:
            raise _engine_error(self.engine_urls[i], err) from None

    async def _call(self, i: int, coro: Any) -> Any:
        try:
            return await coro
        except InferenceError as err:
            raise _engine_error(self.engine_urls[i], err) from None


def _engine_error(url: str, err: InferenceError) -> GatewayError:
    if err.status_code is None:
        return GatewayError(503, f"the inference engine at {url} is unreachable: {err.message}")
    if 400 <= err.status_code < 500:
        return GatewayError(400, f"the inference engine refused the request: {err.message}")
    return GatewayError(502, f"the inference engine at {url} failed: {err.message}")


def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


class TextDeltas:
    """Turns cumulative texts into deltas, holding back a trailing partial UTF-8 character (the
    replacement char) until the next token completes it."""

    def __init__(self) -> None:
        self.sent = ""

    def delta(self, text: str, final: bool = False) -> str:
        stable = text if final else text.rstrip("\ufffd")
        if not stable.startswith(self.sent):  # decoding changed earlier text: send nothing new
            return ""
        out = stable[len(self.sent) :]
        self.sent = stable
        return out
