"""The engine's record of one sequence in flight, and its SGLang-shaped output."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from areal.plugins.inference.embedded.grammar import GrammarMatcher
from areal.plugins.inference.embedded.requests import Emit, SequenceRequest


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
    token_versions: list[str] = field(default_factory=list)
    finish: dict[str, Any] | None = None
    text: str = ""  # decoded output (kept current only when stop strings or streaming need it)

    @property
    def output_ids(self) -> list[int]:
        return self.full_ids[self.prompt_len :]

    @property
    def pending(self) -> list[int]:
        """Tokens to feed in the next forward: the prompt at first, then the last sampled token."""
        return self.full_ids[self.kv_len :]

    @property
    def reserve(self) -> int:
        return self.prompt_len + self.req.params.max_new_tokens

    def payload(
        self, weight_version: str, text: str, token_text: Callable[[int], str]
    ) -> dict[str, Any]:
        req = self.req
        meta: dict[str, Any] = {
            "id": req.rid,
            "prompt_tokens": self.prompt_len,
            "completion_tokens": len(self.output_ids),
            "cached_tokens": 0,
            "finish_reason": self.finish,
            "weight_version": weight_version,
            "weight_versions": version_spans(self.token_versions),
            "e2e_latency": time.perf_counter() - req.created,
        }
        if req.return_logprob:
            name = token_text if req.return_text_in_logprobs else (lambda _: None)
            meta["output_token_logprobs"] = [
                [lp, tok, name(tok)] for lp, tok in zip(self.output_logprobs, self.output_ids)
            ]
            if self.input_logprobs is not None:
                meta["input_token_logprobs"] = self.input_logprobs
            if req.top_logprobs_num > 0:
                meta["output_top_logprobs"] = self.output_top_logprobs
        return {"text": text, "output_ids": list(self.output_ids), "meta_info": meta}


def version_spans(versions: list[str]) -> list[dict[str, Any]]:
    """Per-token versions -> ``[{"version", "start", "end"}]`` spans over output positions."""
    spans: list[dict[str, Any]] = []
    for i, v in enumerate(versions):
        if spans and spans[-1]["version"] == v:
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": v, "start": i, "end": i + 1})
    return spans
