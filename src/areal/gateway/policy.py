"""The policy as the gateway sees it: the chat template, the engines, token-exact generations.

Prompts are rendered with the policy tokenizer's chat template and tokenized here; the output
tokens, log-probs and per-token versions are taken from the engine as generated, never
re-tokenized. The engines are those of the :class:`~areal.gateway.engine_pool.EnginePool`
(attached at start-up or later, detached at any time), picked by fewest running calls or sticky
per session (the same conversation keeps landing on the engine that holds its prefix).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from areal.core.inference_records import GenerateOutput, InferenceError, UnknownTokenVersionsError
from areal.core.plugins import registry
from areal.core.tool_calls import ToolCallParser
from areal.core.types import sampling_record, version_number
from areal.gateway.engine_pool import Engine, EngineLost, EnginePool, normalize_url, note_lost
from areal.gateway.errors import GatewayError
from areal.gateway.router_config import ModelRoute
from areal.gateway.tools_fallback import (
    CALL_CLOSE,
    CALL_OPEN,
    call_text,
    renders_tools,
    system_prompt_tools,
    uses_tools,
)
from areal.gateway.tools_fallback import MODE as TOOLS_FALLBACK_MODE

DEFAULT_ALIASES = ("default",)

log = logging.getLogger("areal.gateway.policy")
MAX_DROPPED_KINDS = 64  # distinct hosted-tool types counted by name; more are counted as "other"

# The sampling params that constrain decoding with a grammar (SGLang's names, as sent).
GRAMMAR_PARAMS = ("json_schema", "regex", "ebnf", "structural_tag")
# Backends whose reported log-prob is taken after the grammar's vocabulary mask.
MASKED_GRAMMAR_BACKENDS = frozenset({"sglang"})


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
    delta_text: str | None = None  # while streaming: the text this step added (None: all of it)

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
        versions = [version_number(v) for v in _labels(out, engine)]
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


def _labels(out: GenerateOutput, engine: str) -> list[str]:
    """The version of each output token; never a guess (training on one would be wrong)."""
    try:
        return out.token_versions(default=out.weight_version)
    except UnknownTokenVersionsError as err:
        raise GatewayError(
            502, f"the inference engine at {engine} cannot be trained on: {err}"
        ) from None


class StreamGeneration(Generation):
    """A streamed generation so far. Its lists are the stream's own and keep growing after it
    is yielded, and ``text`` is joined from the engine output only when read: rebuilding them
    for every chunk would cost O(n²) per stream. Readers that follow every step use
    ``delta_text`` (:class:`TextDeltas`)."""

    _output: GenerateOutput | None = None
    _text: str = ""

    @property  # type: ignore[override]
    def text(self) -> str:
        return (self._output.text or "") if self._output is not None else self._text

    @text.setter
    def text(self, value: str) -> None:
        self._text, self._output = value, None


class GenerationStream:
    """Engine outputs of one stream → :class:`StreamGeneration` s, each in time linear in what
    its chunk added: the versions of new tokens only, from the spans (a handful)."""

    def __init__(self, prompt_ids: list[int], engine: str, sampling: dict[str, Any]) -> None:
        self.prompt_ids = prompt_ids
        self.engine = engine
        self.sampling = sampling_record(sampling)
        self.versions: list[int] = []

    def step(self, out: GenerateOutput) -> StreamGeneration:
        n = len(out.output_ids)
        if out.finished:  # once, O(n): the final labels as a plain answer would have them
            self.versions[:] = [version_number(v) for v in _labels(out, self.engine)]
        elif n > len(self.versions):
            self.versions.extend(self._new_versions(out, len(self.versions), n))
        reason = out.finish_reason
        gen = StreamGeneration(
            text="",
            output_ids=out.output_ids,
            logprobs=out.output_logprobs,
            versions=self.versions,
            prompt_ids=self.prompt_ids,
            finish_reason=reason.type if reason else None,
            matched_stop=reason.matched if reason else None,
            engine=self.engine,
            meta=out.meta_info,
            sampling=self.sampling,
            delta_text=out.delta_text,
        )
        gen._output = out
        return gen

    def _new_versions(self, out: GenerateOutput, start: int, end: int) -> list[int]:
        if not out.spans_known:
            _labels(out, self.engine)  # raises: the tokens' versions are unknown
        labels = [out.weight_version] * (end - start)
        for span in out.weight_versions:
            for i in range(max(start, span.start), min(end, span.end)):
                labels[i - start] = span.version
        return [version_number(v) for v in labels]


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
        pool: EnginePool | None = None,
    ) -> None:
        self.route = route
        self.pool = pool or EnginePool(engine_backend)
        self.initial_engines = [normalize_url(url) for url in engines]
        self.tokenizer_path = tokenizer_path
        self.context_length = context_length
        self.aliases = tuple(aliases)
        self.tokenizer: Any = None
        self._encoding: tuple[Any, Callable[[str], list[int]]] | None = None  # (tokenizer, its)
        self.published: tuple[int, str] | None = None  # the trainer's newest (version, weights)
        self._noted: set[tuple[str, Any]] = set()  # client sampling values logged as overridden
        # Calls whose client value of each field the run's sampling replaced or dropped (the
        # log line says each distinct value once; this counts every call): GET /rl/sessions.
        self.overridden: dict[str, int] = {}
        # Calls whose engine reports log-probs under a mask the trainer does not replay (SGLang
        # takes them after a grammar's vocabulary mask, docs/inference.md): GET /rl/sessions.
        self.masked_logprobs: dict[str, int] = {}
        # Tools left out of prompts because the policy cannot call them (hosted web search,
        # namespaces...: chat_messages.hosted_tool_kind), by type: GET /rl/sessions.
        self.dropped_tools: dict[str, int] = {}
        # Requests whose tools the chat template cannot render, said in the system turn instead
        # (tools_fallback.system_prompt_tools), by fallback: GET /rl/sessions.
        self.tools_fallback: dict[str, int] = {}
        self._renders_tools: tuple[Any, bool] | None = None  # (tokenizer, does its template)
        parser = tool_parser or route.tool_parser or DEFAULT_TOOL_PARSER
        self.tool_parser: ToolCallParser = registry("tool_parsers").get(
            parser, key="model_routing.policy_model.tool_parser"
        )()

    @property
    def model_id(self) -> str:
        return self.route.model_id

    @property
    def engine_urls(self) -> list[str]:
        return self.pool.urls

    def serves(self, model: str | None) -> bool:
        """Is ``model`` the policy? (Clients may also say ``default``, or nothing.)"""
        return not model or model == self.model_id or model in self.aliases

    async def start(self) -> None:
        """Attach the engines given at start-up (each must answer), load the tokenizer (from
        ``--tokenizer``, else from the first engine) and start the health checks."""
        for url in self.initial_engines:
            await self.attach(url)
        if self.tokenizer is None and self.tokenizer_path:
            self.tokenizer = await asyncio.to_thread(_load_tokenizer, self.tokenizer_path)
        self.pool.start()

    async def attach(
        self, url: str, *, backend: str | None = None, owner: str | None = None
    ) -> Engine:
        """Take ``url`` into service: it must answer ``/model_info``; the first engine gives the
        tokenizer and context length when none were given; an engine behind the trainer's newest
        published weights loads them first, so it never serves an older policy than the rest."""
        url = normalize_url(url)
        client = self.pool.client_for(url, backend)
        try:
            info = await client.model_info()
            if self.tokenizer is None:
                self.tokenizer_path = (
                    self.tokenizer_path or info.get("tokenizer_path") or info.get("model_path")
                )
                if not self.tokenizer_path:
                    raise GatewayError(
                        400,
                        f"the engine at {url} does not say where its tokenizer is: start the "
                        "gateway with --tokenizer DIR",
                        param="url",
                    )
                self.tokenizer = await asyncio.to_thread(_load_tokenizer, self.tokenizer_path)
            self.context_length = (
                self.context_length or info.get("context_length") or info.get("max_context_length")
            )
            version = info.get("weight_version")
            if self.published is not None and version_number(version) < self.published[0]:
                newest, path = self.published
                await client.update_weights_from_disk(path, weight_version=str(newest))
                log.info("engine %s loaded the newest weights (version %d) first", url, newest)
                version = str(newest)
        except InferenceError as err:
            await client.aclose()
            raise GatewayError(
                400 if err.status_code is None else 502,
                f"the engine at {url} cannot be attached: {err.message}",
                param="url",
                code="engine_unreachable",
            ) from None
        except BaseException:
            await client.aclose()
            raise
        engine = Engine(
            url=url,
            client=client,
            backend=backend or self.pool.backend,
            owner=owner,
            weight_version=None if version is None else str(version),
        )
        return self.pool.add(engine)

    async def close(self) -> None:
        await self.pool.close()

    # --- prompts ----------------------------------------------------------------------------

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        prefix: str = "",
        *,
        history: Sequence[int] | None = None,
        log_fields: dict[str, Any] | None = None,
    ) -> list[int]:
        """Prompt token ids for an OpenAI-shaped chat (plus a forced ``prefix`` of the reply).

        Tools (offered, or calls and results in the history) on a template that cannot render
        them are said in the system turn instead (:mod:`.tools_fallback`); ``log_fields``: the
        request's ``gateway.log`` fields, which then name the fallback.

        ``history``: the tokens of the episode so far (its last call's prompt and output). When
        the rendered chat's text starts with exactly their text, the prompt reuses those tokens
        and only the new text is tokenized: a generated output that does not survive decode ->
        re-encode (a character split across tokens, runs of newlines the tokenizer would merge,
        tokens at the prompt/output boundary) then still extends the episode token for token, so
        the turns merge into one sample and the engine reuses its cached prefix. Text that differs
        (an agent that edited history, a template that re-renders past turns) falls back to
        tokenizing the whole chat.
        """
        if self.tokenizer is None:  # no engine has been attached yet
            raise self.pool.unavailable()
        if uses_tools(messages, tools) and not self.template_renders_tools():
            messages, tools = system_prompt_tools(messages, tools), None
            self.note_tools_fallback(log_fields)
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools or None, tokenize=False, add_generation_prompt=True
            )
        except Exception as err:  # template errors are the client's (bad roles, content parts)
            raise GatewayError(
                400, f"messages cannot be rendered with the policy's chat template: {err}"
            ) from None
        text = str(text) + prefix
        encode = self._encoder()
        if history:
            head = self.tokenizer.decode(list(history), clean_up_tokenization_spaces=False)
            if head and text.startswith(head):
                return list(history) + encode(text[len(head) :])
        return encode(text)

    def template_renders_tools(self) -> bool:
        """Does the policy's chat template render tools? (:func:`.renders_tools`, once per
        tokenizer.)"""
        if self._renders_tools is None or self._renders_tools[0] is not self.tokenizer:
            self._renders_tools = (self.tokenizer, renders_tools(self.tokenizer))
        return self._renders_tools[1]

    def note_tools_fallback(self, log_fields: dict[str, Any] | None) -> None:
        """Name the fallback on the request's ``gateway.log`` line (``tools_fallback=
        system_prompt``), count it, and say why once (a WARNING, the first time)."""
        if log_fields is not None:
            log_fields["tools_fallback"] = TOOLS_FALLBACK_MODE
        if not self.tools_fallback:
            log.warning(
                "the policy's chat template (%s) does not render tools: a probe tool given to it "
                "does not appear in the prompt. Requests with tools get them in "
                "the system turn instead, in the Hermes format (<tools> signatures, "
                "<tool_call> calls, <tool_response> results as user turns; docs/gateway.md, "
                "'Tools on a template without tool support')%s",
                self.tokenizer_path or "the engine's tokenizer",
                self._parser_mismatch(),
            )
        self.tools_fallback[TOOLS_FALLBACK_MODE] = (
            self.tools_fallback.get(TOOLS_FALLBACK_MODE, 0) + 1
        )

    def _parser_mismatch(self) -> str:
        """A warning's tail when the policy's tool parser does not read the fallback's calls."""
        text = call_text("f", '{"x": 1}')
        calls = [(c.name, c.arguments) for c in self.tool_parser.parse(text).tool_calls]
        forced = (self.tool_parser.forced_prefix(), self.tool_parser.forced_suffix())
        if calls == [("f", '{"x": 1}')] and forced == (CALL_OPEN, CALL_CLOSE):
            return ""
        return (
            f"; the policy's tool parser {type(self.tool_parser).__name__} does not read or "
            "force that format (model_routing.policy_model.tool_parser: use hermes), so calls "
            "will come back as text"
        )

    def _encoder(self) -> Callable[[str], list[int]]:
        """:func:`text_encoder` of the current tokenizer (made again if it was replaced)."""
        if self._encoding is None or self._encoding[0] is not self.tokenizer:
            self._encoding = (self.tokenizer, text_encoder(self.tokenizer))
        return self._encoding[1]

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
        if params.get("top_k") == 1:
            # One candidate is greedy decoding; said as temperature 0, every engine reports the
            # plain log-softmax for it (SGLang otherwise divides by T unless the whole batch is
            # greedy), the value the trainer recomputes for top-k 1 (types.training_temperature).
            params["temperature"] = 0.0
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
            if value is None or value == route.get(key):
                continue
            self.overridden[key] = self.overridden.get(key, 0) + 1
            if (key, value) not in self._noted:
                self._noted.add((key, value))
                log.info(
                    "a client asked for %s=%s; the run's sampling applies (%s)",
                    key,
                    value,
                    route.get(key, "off"),
                )
        return None, None, kept

    # --- generation -------------------------------------------------------------------------

    async def generate(
        self, prompt_ids: list[int], sampling: dict[str, Any], *, sticky: str | None = None
    ) -> Generation:
        """One generation; a call its engine lost (detached, down) is tried on the next live
        engine, as nothing of it reached the client."""
        tried: set[str] = set()
        while True:
            engine = self._next_engine(sticky, tried)
            self._note_masked(engine, sampling)
            try:
                out = await self._call(
                    engine,
                    engine.client.generate(input_ids=prompt_ids, sampling_params=sampling),
                )
            except EngineLost:
                tried.add(engine.url)
                continue
            return Generation.from_output(out, prompt_ids, engine.url, sampling)

    async def stream(
        self, prompt_ids: list[int], sampling: dict[str, Any], *, sticky: str | None = None
    ) -> AsyncIterator[Generation]:
        """Cumulative generations as the engine produces tokens; the last one is finished. A
        stream lost before its first token moves to another engine; one lost later ends with
        :class:`EngineLost`, and its episode is marked (see :mod:`.engine_pool`)."""
        tried: set[str] = set()
        while True:
            engine = self._next_engine(sticky, tried)
            self._note_masked(engine, sampling)
            started = False
            outputs = engine.client.generate_stream(
                input_ids=prompt_ids, sampling_params=sampling, coalesce=True
            )
            generations = GenerationStream(prompt_ids, engine.url, sampling)
            try:
                async for out in self.pool.stream(engine, outputs):
                    started = True
                    yield generations.step(out)
                return
            except EngineLost:
                if started:
                    note_lost(engine.url)
                    raise
                tried.add(engine.url)
            except InferenceError as err:
                lost = self._lost(engine, err)
                if lost is None:
                    raise _engine_error(engine.url, err) from None
                if started:
                    note_lost(engine.url)
                    raise lost from None
                tried.add(engine.url)

    def note_dropped_tools(self, log_fields: dict[str, Any], kinds: Sequence[str]) -> None:
        """Count the hosted tools a request's prompt left out, name them on its ``gateway.log``
        line (``dropped_tools=web_search,namespace``), and log each type the first time."""
        if not kinds:
            return
        log_fields["dropped_tools"] = ",".join(kinds)
        for kind in kinds:
            if kind not in self.dropped_tools and len(self.dropped_tools) >= MAX_DROPPED_KINDS:
                kind = "other"  # clients choose the names: the counter's size is bounded
            if kind not in self.dropped_tools:
                log.warning(
                    "a %r tool was left out of the prompt: the policy is offered function tools "
                    "only (hosted and built-in tools are the provider's to run)",
                    kind,
                )
            self.dropped_tools[kind] = self.dropped_tools.get(kind, 0) + 1

    def _note_masked(self, engine: Engine, sampling: dict[str, Any]) -> None:
        """Count (and log once per engine) a grammar-constrained call to an engine that reports
        the masked log-prob: its forced tokens' behaviour log-probs are near 0 while the trainer
        recomputes the unmasked value, so their importance weights are off. SGLang offers no
        option that reports the unmasked value; vLLM and the embedded engine report it."""
        grammar = next((key for key in GRAMMAR_PARAMS if sampling.get(key) is not None), None)
        if grammar is None or engine.backend not in MASKED_GRAMMAR_BACKENDS:
            return
        if not self.masked_logprobs.get(engine.backend):
            log.warning(
                "%s reports a grammar-constrained token's log-prob after the grammar's mask "
                "(%s): the trainer recomputes the unmasked value, so forced tokens' importance "
                "weights are off; vLLM and the embedded engine report the unmasked value",
                engine.backend,
                grammar,
            )
        self.masked_logprobs[engine.backend] = self.masked_logprobs.get(engine.backend, 0) + 1

    def _next_engine(self, sticky: str | None, tried: set[str]) -> Engine:
        """The engine for the next try; when a lost call has nowhere left to go, its episode is
        marked (it misses an answer) and the client gets the 503."""
        try:
            return self.pool.pick(sticky, avoid=tried)
        except GatewayError:
            if tried:
                note_lost(sorted(tried)[0])
            raise

    async def _call(self, engine: Engine, work: Any) -> Any:
        """One tracked call; an engine that cannot be reached is marked down (:class:`EngineLost`)."""
        try:
            return await self.pool.call(engine, work)
        except InferenceError as err:
            lost = self._lost(engine, err)
            if lost is not None:
                raise lost from None
            raise _engine_error(engine.url, err) from None

    def _lost(self, engine: Engine, err: InferenceError) -> EngineLost | None:
        """A transport failure (no HTTP answer): the engine is down, the call lost."""
        if err.status_code is not None:
            return None
        self.pool.mark_down(engine, err.message)
        return EngineLost(engine.url, "could not be reached")


def _engine_error(url: str, err: InferenceError) -> GatewayError:
    if err.status_code is None:
        return GatewayError(503, f"the inference engine at {url} is unreachable: {err.message}")
    if 400 <= err.status_code < 500:
        return GatewayError(400, f"the inference engine refused the request: {err.message}")
    return GatewayError(502, f"the inference engine at {url} failed: {err.message}")


def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def text_encoder(tokenizer: Any) -> Callable[[str], list[int]]:
    """``tokenizer.encode(text, add_special_tokens=False)``, as directly as it can be had.

    A fast tokenizer's own Rust tokenizer gives the same ids ~40 % sooner: transformers' call
    goes through ``encode_batch`` (a thread pool) for one text, the largest single part of
    rendering a short chat. Not when the Rust tokenizer truncates or pads (set in its
    ``tokenizer.json``): transformers turns those off per call, so its own call is used then."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.truncation is not None or backend.padding is not None:
        return lambda text: list(tokenizer.encode(text, add_special_tokens=False))
    return lambda text: backend.encode(text, add_special_tokens=False).ids


class TextDeltas:
    """A stream's generations → the text each adds, such that the pieces join to the final text.

    A streamed step says its ``delta_text`` (O(new text)); a cumulative one (``delta_text``
    None) what its text adds, holding back a trailing partial UTF-8 character (U+FFFD). The
    finished generation says what its text adds to all that was said, so an engine that trimmed
    a stop string from its final text (or a caller that held text back) still ends exactly on
    it. A piece once said is never taken back: when the final text does not start with what was
    said, nothing more is said.
    """

    def __init__(self) -> None:
        self.said: list[str] = []
        self._seen = ""  # the stable text of the last cumulative generation

    def step(self, gen: Generation) -> str:
        """What ``gen`` adds."""
        return self.final(gen.text) if gen.finished else self.say(self.new_text(gen))

    def new_text(self, gen: Generation) -> str:
        """What an unfinished ``gen`` adds to the text, before any hold-back of the caller."""
        if gen.delta_text is not None:
            return gen.delta_text
        stable = gen.text.rstrip("\ufffd")
        if not stable.startswith(self._seen):  # decoding changed earlier text: nothing new
            return ""
        new, self._seen = stable[len(self._seen) :], stable
        return new

    def say(self, piece: str) -> str:
        if piece:
            self.said.append(piece)
        return piece

    def final(self, text: str) -> str:
        """What the final ``text`` adds to all that was said (O(n), once)."""
        said = "".join(self.said)
        self.said = [text]
        return text[len(said) :] if text.startswith(said) else ""
