"""The engine's record of one sequence in flight, and its SGLang-shaped output."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from areal.plugins.inference.embedded.grammar import GrammarMatcher
from areal.plugins.inference.embedded.requests import Emit, SequenceRequest
from areal.plugins.inference.embedded.streaming import TextChunker


@dataclass
class Sequence:
    req: SequenceRequest
    emit: Emit
    full_ids: list[int]
    prompt_len: int
    stop_ids: frozenset[int]
    generator: torch.Generator | None = None
    matcher: GrammarMatcher | None = None
    slots: torch.Tensor | None = None  # reserved KV slots: prompt + max_new_tokens
    kv_len: int = 0  # tokens whose k/v are in the cache
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[list[list[Any]]] = field(default_factory=list)
    input_logprobs: list[list[Any]] | None = None
    spans: list[dict[str, Any]] = field(default_factory=list)  # weight_versions, kept as sampled
    finish: dict[str, Any] | None = None
    text: str = ""  # decoded output (kept current only when stop strings or streaming need it)
    chunker: TextChunker | None = None  # set when the request streams incremental chunks
    streamed: int = 0  # output tokens already sent in incremental chunks

    @property
    def output_ids(self) -> list[int]:
        return self.full_ids[self.prompt_len :]

    @property
    def n_output(self) -> int:
        """``len(output_ids)`` without copying them (it is asked after every token)."""
        return len(self.full_ids) - self.prompt_len

    @property
    def pending(self) -> list[int]:
        """Tokens to feed in the next forward: the prompt at first, then the last sampled token."""
        return self.full_ids[self.kv_len :]

    @property
    def reserve(self) -> int:
        return self.prompt_len + self.req.params.max_new_tokens

    def add_token(self, token: int, logprob: float, version: str) -> None:
        """Record a sampled token; its version extends the last span or opens a new one."""
        self.full_ids.append(token)
        self.output_logprobs.append(logprob)
        n = self.n_output
        if self.spans and self.spans[-1]["version"] == version:
            self.spans[-1]["end"] = n
        else:
            self.spans.append({"version": version, "start": n - 1, "end": n})

    def payload(
        self, weight_version: str, text: str, token_text: Callable[[int], str]
    ) -> dict[str, Any]:
        """The whole output so far: a plain answer, or a cumulative stream chunk."""
        return self._payload(weight_version, text, token_text, 0, input_logprobs=True)

    def chunk(
        self, weight_version: str, text: str, token_text: Callable[[int], str]
    ) -> dict[str, Any]:
        """An incremental stream chunk: the ids, log-probs and ``text`` new since the last one.
        Counts and ``weight_versions`` (a few spans) stay whole, as in SGLang's incremental
        mode; the prompt's log-probs ride on the final chunk, where a reader of the answer looks."""
        first, self.streamed = self.streamed, self.n_output
        return self._payload(
            weight_version, text, token_text, first, input_logprobs=self.finish is not None
        )

    def _payload(
        self,
        weight_version: str,
        text: str,
        token_text: Callable[[int], str],
        first: int,
        input_logprobs: bool,
    ) -> dict[str, Any]:
        req = self.req
        ids = self.full_ids[self.prompt_len + first :]
        meta: dict[str, Any] = {
            "id": req.rid,
            "prompt_tokens": self.prompt_len,
            "completion_tokens": self.n_output,
            "cached_tokens": 0,
            "finish_reason": self.finish,
            "weight_version": weight_version,
            # copies: the HTTP thread serialises this payload while the engine extends the spans
            "weight_versions": [dict(span) for span in self.spans],
            "e2e_latency": time.perf_counter() - req.created,
        }
        if req.return_logprob:
            name = token_text if req.return_text_in_logprobs else (lambda _: None)
            meta["output_token_logprobs"] = [
                [lp, tok, name(tok)] for lp, tok in zip(self.output_logprobs[first:], ids)
            ]
            if self.input_logprobs is not None and input_logprobs:
                meta["input_token_logprobs"] = self.input_logprobs
            if req.top_logprobs_num > 0:
                meta["output_top_logprobs"] = self.output_top_logprobs[first:]
        return {"text": text, "output_ids": ids, "meta_info": meta}
