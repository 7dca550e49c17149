"""From one ``/generate`` body to the sequences the engine runs, and back to SGLang's JSON shape."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from areal.plugins.inference.embedded.schema import (
    GenerateRequest,
    SamplingParams,
    describe_validation_error,
)


class RequestError(ValueError):
    """Bad input: the HTTP layer answers 400 with this message."""

    def __init__(self, message: str, status_code: int = 400) -> None:
        super().__init__(message)
        self.status_code = status_code


Emit = Callable[[dict[str, Any], bool], None]  # (payload, final) from the engine thread


@dataclass
class SequenceRequest:
    """One sequence to generate (a batch item, or one of ``n`` samples)."""

    rid: str
    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    stream: bool = False
    return_text_in_logprobs: bool = False
    group: str = ""  # the client's rid when n > 1 splits it into rid-0, rid-1, ...
    created: float = field(default_factory=time.perf_counter)


def _per_item(value: Any, n: int, name: str) -> list[Any]:
    if isinstance(value, list):
        if len(value) != n:
            raise RequestError(f"{name} has {len(value)} entries for a batch of {n}")
        return value
    return [value] * n


def _sampling_params(raw: Any, where: str) -> SamplingParams:
    try:
        params = SamplingParams.model_validate(raw or {})
    except ValidationError as err:
        raise RequestError(f"{where}: {describe_validation_error(err)}") from None
    bad = params.unsupported()
    if bad:
        raise RequestError(f"{where}: {', '.join(bad)} not supported by the embedded engine")
    return params


def expand_generate(
    req: GenerateRequest, encode: Callable[[str], list[int]], vocab_size: int
) -> tuple[list[SequenceRequest], bool]:
    """Normalise a (possibly batched) request; returns the sequences and whether to answer a list."""
    bad = req.unsupported()
    if bad:
        raise RequestError(f"{', '.join(bad)} not supported by the embedded engine")
    if (req.text is None) == (req.input_ids is None):
        raise RequestError("give exactly one of 'text' or 'input_ids'")
    prompts: list[list[int]]
    if req.input_ids is not None:
        is_batch = bool(req.input_ids) and isinstance(req.input_ids[0], list)
        prompts = req.input_ids if is_batch else [req.input_ids]
        for p in prompts:
            if not isinstance(p, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in p
            ):
                raise RequestError("input_ids must be a list of token ids or a list of such lists")
            if any(t < 0 or t >= vocab_size for t in p):
                raise RequestError(
                    f"input_ids hold a token id outside the vocabulary [0, {vocab_size})"
                )
    else:
        is_batch = isinstance(req.text, list)
        texts = req.text if isinstance(req.text, list) else [req.text]
        prompts = [encode(t) for t in texts if isinstance(t, str)]
    if not prompts or any(len(p) == 0 for p in prompts):
        raise RequestError("the prompt is empty")
    n_prompts = len(prompts)
    raw_params = _per_item(req.sampling_params, n_prompts, "sampling_params")
    params = [_sampling_params(p, "sampling_params") for p in raw_params]
    for sampling in params:
        if any(t < 0 or t >= vocab_size for t in sampling.stop_token_ids or ()):
            raise RequestError(
                f"sampling_params.stop_token_ids hold a token id outside the vocabulary "
                f"[0, {vocab_size})"
            )
    logprob = _per_item(req.return_logprob, n_prompts, "return_logprob")
    start = _per_item(req.logprob_start_len, n_prompts, "logprob_start_len")
    top = _per_item(req.top_logprobs_num, n_prompts, "top_logprobs_num")
    if any(at < -1 for at in start):
        raise RequestError("logprob_start_len must be -1 (output only) or a prompt position >= 0")
    if any(not 0 <= k <= vocab_size for k in top):
        raise RequestError(f"top_logprobs_num must be within [0, {vocab_size}] (the vocabulary)")
    if isinstance(req.rid, str) and n_prompts > 1:
        raise RequestError("a batch needs one rid per prompt (a list), or none")
    rids = _per_item(req.rid, n_prompts, "rid") if isinstance(req.rid, list) else None
    out: list[SequenceRequest] = []
    for i, prompt in enumerate(prompts):
        base = (rids[i] if rids else None) or (
            req.rid if isinstance(req.rid, str) and n_prompts == 1 else None
        )
        base = base or uuid.uuid4().hex
        n = params[i].n
        for j in range(n):
            out.append(
                SequenceRequest(
                    rid=base if n == 1 else f"{base}-{j}",
                    input_ids=list(prompt),
                    params=params[i],
                    return_logprob=bool(logprob[i]),
                    logprob_start_len=int(start[i]),
                    top_logprobs_num=int(top[i]),
                    stream=req.stream,
                    return_text_in_logprobs=req.return_text_in_logprobs,
                    group=base,
                )
            )
    return out, is_batch or len(out) > 1
