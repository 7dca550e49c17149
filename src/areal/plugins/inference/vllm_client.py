"""Async client for a vLLM server, answering in areal's terms (:class:`EngineClient`).

Generation goes through vLLM's token-in/token-out route ``/inference/v1/generate`` (enabled by
``--enable-scale-out``) with ``output_mode: text`` and ``return_token_ids``: token ids, the
sampled tokens' log-probs and the text in one answer. SGLang-style sampling params (what the
gateway sends) are mapped onto vLLM's, and an unknown one is refused rather than dropped. The
log-prob of a sampled token is log softmax(z / T) over the whole vocabulary, as the trainer
recomputes it: vLLM's own ``raw_logprobs`` are at T = 1, and areal's worker extension, which the
server's workers load, divides by the request's temperature first (:meth:`behaviour_logprobs`
asks a server whether it does).

Weight versions per token are vLLM's own: its engine stamps every step with the version set by
``/update_weight_version`` and returns ``weight_versions`` spans on the final chunk. The pause
modes map onto vLLM's ``/pause``:

- ``in_place`` is ``mode=keep``: in-flight requests freeze with their KV cache and go on with the
  new weights; their spans show the switch.
- ``retract`` is ``mode=abort``, and this client resubmits: a request that ends ``abort`` without
  its caller asking is sent again with its prompt plus the tokens it had, for the tokens it has
  left (vLLM queues it until ``/resume``), so it is prefilled on the new weights and the caller
  gets one answer with spans from both pieces. This is the retract-and-resubmit of AReaL's vLLM
  client. (The engine is not asked whether it is paused: a weight update can be over, and
  ``/resume`` sent, before the aborted answer arrives.)
- ``abort`` is ``mode=abort`` too, and the engine cannot tell it from ``retract``: requests of the
  client that paused with ``abort`` end ``abort``; another client's are resubmitted, as after a
  retract (the trainer pauses with ``retract`` or ``in_place`` only).

A request this client was asked to abort (``abort_request``) is never resubmitted.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from areal.core.inference_records import (
    PAUSE_MODES,
    FinishReason,
    GenerateOutput,
    InferenceError,
    PauseMode,
    SamplingParams,
    StreamChunking,
    StreamOutput,
    TextPieces,
    WeightVersionSpan,
    coalesced,
)
from areal.plugins.inference.sglang_client import InferenceClient, _json

ROUTE = "/inference/v1/generate"
RID_PREFIX = "generate-tokens-"  # what vLLM puts before a request id it was given
MAX_PIECES = 64  # a request cut by more retracts than this ends ``abort``: something is wrong

# SGLang sampling param -> vLLM SamplingParams field, for the ones that only change name.
_RENAMED = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "sampling_seed": "seed",
    "no_stop_trim": "include_stop_str_in_output",
}
_SAME = {
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "n",
    "logit_bias",
}
# SGLang's grammar keys -> vLLM's ``structured_outputs`` (``StructuredOutputsParams``); a
# structural tag is xgrammar's format on both, as a JSON string.
_STRUCTURED = {
    "json_schema": "json",
    "regex": "regex",
    "ebnf": "grammar",
    "structural_tag": "structural_tag",
}


def vllm_sampling(params: SamplingParams | Mapping[str, Any] | None) -> dict[str, Any]:
    """SGLang-style ``sampling_params`` as vLLM's; ``ValueError`` naming a key vLLM lacks."""
    source = params.to_json() if isinstance(params, SamplingParams) else dict(params or {})
    out: dict[str, Any] = {}
    structured: dict[str, Any] = {}
    for key, value in source.items():
        if value is None:
            continue
        if key in _RENAMED:
            out[_RENAMED[key]] = value
        elif key in _SAME:
            out[key] = value
        elif key in _STRUCTURED:
            is_schema = key == "json_schema" and isinstance(value, str)
            structured[_STRUCTURED[key]] = json.loads(value) if is_schema else value
        else:
            raise ValueError(f"sampling param {key!r} has no vLLM equivalent")
    if structured:
        out["structured_outputs"] = structured
    return out


@dataclass
class _Piece:
    """What one ``/inference/v1/generate`` answer (or stream chunk) carried."""

    ids: list[int]
    logprobs: list[float]
    text: str
    finish: str | None
    stop_reason: int | str | None
    spans: list[WeightVersionSpan] | None
    usage: dict[str, Any]


def _piece(data: Mapping[str, Any], url: str) -> _Piece:
    choices = data.get("choices") or []
    if not choices:
        raise InferenceError(200, f"vLLM answered without choices: {str(data)[:200]}", url)
    choice = choices[0]
    content = (choice.get("logprobs") or {}).get("content") or []
    spans = choice.get("weight_versions")
    return _Piece(
        ids=[int(t) for t in choice.get("token_ids") or []],
        logprobs=[float(c["logprob"]) for c in content],
        text=str(choice.get("text") or ""),
        finish=choice.get("finish_reason"),
        stop_reason=choice.get("stop_reason"),
        spans=None
        if spans is None
        else [WeightVersionSpan(str(s["version"]), int(s["start"]), int(s["end"])) for s in spans],
        usage=dict(data.get("usage") or {}),
    )


@dataclass
class _Answer:
    """One caller's request, assembled across stream chunks and resubmitted pieces."""

    prompt_ids: list[int]
    rid: str
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: TextPieces = field(default_factory=TextPieces)
    spans: list[WeightVersionSpan] = field(default_factory=list)
    piece_start: int = 0  # where the current piece's tokens start in ``ids``
    finish: FinishReason | None = None
    cached_tokens: int = 0
    version: str = "default"
    retracted: bool = False  # the current piece ended in a pause that retracted it
    pieces: int = 1

    def add(self, piece: _Piece) -> None:
        self.ids += piece.ids
        self.logprobs += piece.logprobs
        self.text.add(piece.text)
        cached = (piece.usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        if isinstance(cached, int) and self.piece_start == 0:
            self.cached_tokens = cached
        if piece.spans is not None:
            for span in piece.spans:
                start, end = span.start + self.piece_start, span.end + self.piece_start
                last = self.spans[-1] if self.spans else None
                if last is not None and last.version == span.version and last.end == start:
                    self.spans[-1] = WeightVersionSpan(span.version, last.start, end)
                else:
                    self.spans.append(WeightVersionSpan(span.version, start, end))
            if self.spans:
                self.version = self.spans[-1].version
        if piece.finish is not None:
            self.finish = _finish_reason(piece, self.ids)

    def next_piece(self) -> None:
        self.piece_start = len(self.ids)
        self.finish = None
        self.retracted = False
        self.pieces += 1

    def output(self, delta: _Piece | None = None) -> GenerateOutput:
        """The answer so far. A stream's outputs (``delta`` given) share this answer's growing
        lists and join the text only when read, as :class:`StreamOutput` says: copying them for
        every chunk would cost O(n²) per stream."""
        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": self.finish.raw if self.finish else None,
            "prompt_tokens": len(self.prompt_ids),
            "completion_tokens": len(self.ids),
            "cached_tokens": self.cached_tokens,
            "weight_version": self.version,
            "weight_versions": [vars(s) for s in self.spans],
        }
        if delta is None or self.finish is not None:
            # SGLang's shape, for code that reads meta_info: (log-prob, token id, text)
            meta["output_token_logprobs"] = [
                [lp, t, None] for lp, t in zip(self.logprobs, self.ids, strict=False)
            ]
        fields: dict[str, Any] = {
            "finish_reason": self.finish,
            "prompt_tokens": len(self.prompt_ids),
            "completion_tokens": len(self.ids),
            "cached_tokens": self.cached_tokens,
            "rid": self.rid,
            "weight_version": self.version,
            "weight_versions": list(self.spans),
            "prompt_token_ids": list(self.prompt_ids) if delta is None else self.prompt_ids,
            "meta_info": meta,
        }
        if delta is None:
            text = self.text.upto(len(self.text.parts))
            return GenerateOutput(
                output_ids=list(self.ids),
                text=text,
                output_logprobs=list(self.logprobs),
                delta_output_ids=list(self.ids),
                delta_logprobs=list(self.logprobs),
                delta_text=text,
                **fields,
            )
        out = StreamOutput(
            output_ids=self.ids,
            output_logprobs=self.logprobs,
            delta_output_ids=list(delta.ids),
            delta_logprobs=list(delta.logprobs),
            delta_text=delta.text,
            **fields,
        )
        return out.text_from(self.text)


def _finish_reason(piece: _Piece, ids: list[int]) -> FinishReason:
    """vLLM's reason in SGLang's shape: a ``stop`` names what matched (the EOS token when vLLM
    says nothing), a ``length`` its length."""
    if piece.finish == "stop":
        matched = piece.stop_reason
        if matched is None and ids:
            matched = ids[-1]
        return FinishReason(type="stop", matched=matched, raw={"type": "stop", "matched": matched})
    if piece.finish == "length":
        return FinishReason(
            type="length", length=len(ids), raw={"type": "length", "length": len(ids)}
        )
    kind = str(piece.finish)
    return FinishReason(type=kind, raw={"type": kind})


class VLLMClient(InferenceClient):
    """One vLLM server, driven through the same calls as SGLang and the embedded engine."""

    def __init__(self, base_url: str, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self._caller_aborts: set[str] = set()
        self._abort_paused = False  # this client paused with mode abort: nothing is resubmitted

    def __repr__(self) -> str:
        return f"VLLMClient({self.base_url!r})"

    # --- info --------------------------------------------------------------------------------

    async def model_info(self) -> dict[str, Any]:
        """``/v1/models`` and ``/weight_info`` in the keys every areal client answers with."""
        models = _json(await self._request("GET", "/v1/models"))
        data = (models.get("data") or [{}])[0]
        version = _json(await self._request("GET", "/weight_info")).get("weight_version")
        return {
            "model_path": data.get("root"),
            "tokenizer_path": data.get("root"),
            "served_model_name": data.get("id"),
            "context_length": data.get("max_model_len"),
            "weight_version": version,
            "backend": "vllm",
        }

    async def behaviour_logprobs(self) -> dict[str, Any]:
        """Each worker's answer to "are the reported log-probs log softmax(z / T) over the whole
        vocabulary?" (``exact``, else ``why`` not), from areal's worker extension."""
        answers = (await self._rpc("areal_behaviour_logprobs", {}))["results"]
        return {"workers": answers, "exact": all(a["exact"] for a in answers)}

    async def server_info(self) -> dict[str, Any]:
        version = _json(await self._request("GET", "/version"))
        return {**await self.model_info(), "version": version.get("version")}

    # --- generation --------------------------------------------------------------------------

    async def generate(
        self,
        *,
        input_ids: list[int] | None = None,
        text: str | None = None,
        sampling_params: SamplingParams | Mapping[str, Any] | None = None,
        return_logprob: bool = True,
        rid: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> GenerateOutput:
        """One answer, however many pieces a retract pause cut it into."""
        answer, params = await self._start(input_ids, text, sampling_params, rid)
        while True:
            body = self._body(answer, params, return_logprob, extra, stream=False)
            data = await self._post_json(ROUTE, body)
            answer.add(_piece(data, self.base_url + ROUTE))
            if not await self._resubmit(answer, params):
                return answer.output()

    async def generate_stream(
        self,
        *,
        input_ids: list[int] | None = None,
        text: str | None = None,
        sampling_params: SamplingParams | Mapping[str, Any] | None = None,
        return_logprob: bool = True,
        rid: str | None = None,
        extra: Mapping[str, Any] | None = None,
        stream_chunking: StreamChunking | None = None,
        coalesce: bool = False,
    ) -> AsyncIterator[GenerateOutput]:
        """Cumulative outputs after each chunk (vLLM streams deltas), or with ``coalesce`` after
        each network read (see :meth:`InferenceClient.generate_stream`); ``stream_chunking`` is
        SGLang's and has no meaning here."""
        answer, params = await self._start(input_ids, text, sampling_params, rid)
        url = self.base_url + ROUTE
        while True:
            body = self._body(answer, params, return_logprob, extra, stream=True)
            async for batch in self._sse_batches(ROUTE, body):
                outs: list[GenerateOutput] = []
                for data in batch:
                    piece = _piece(data, url)
                    answer.add(piece)
                    if await self._retracted(answer, params):
                        continue  # not the end: the rest comes in the next piece
                    if not coalesce:  # each yielded before the next grows the shared lists
                        yield answer.output(piece)
                    else:
                        outs.append(answer.output(piece))
                if outs:
                    yield coalesced(outs)
            if answer.finish is None:
                raise InferenceError(None, "stream ended before the request finished", url)
            if not await self._resubmit(answer, params):
                return

    async def _start(
        self,
        input_ids: list[int] | None,
        text: str | None,
        sampling_params: SamplingParams | Mapping[str, Any] | None,
        rid: str | None,
    ) -> tuple[_Answer, dict[str, Any]]:
        if (input_ids is None) == (text is None):
            raise ValueError("generate needs exactly one of input_ids or text")
        params = vllm_sampling(sampling_params)
        if input_ids is None:
            tokens = await self._post_json("/tokenize", {"prompt": text})
            input_ids = [int(t) for t in tokens.get("tokens") or []]
        return _Answer(prompt_ids=list(input_ids), rid=rid or uuid.uuid4().hex), params

    def _body(
        self,
        answer: _Answer,
        params: dict[str, Any],
        return_logprob: bool,
        extra: Mapping[str, Any] | None,
        *,
        stream: bool,
    ) -> dict[str, Any]:
        """The request for what is left of ``answer``: after a retract, the prompt grows by the
        tokens already generated and the budgets shrink by as many."""
        done = len(answer.ids)
        sampling = dict(params)
        if done:
            for key in ("max_tokens", "min_tokens"):
                if key in sampling:
                    sampling[key] = max(0, int(sampling[key]) - done)
        if return_logprob:
            sampling["logprobs"] = 0  # the sampled token's log-prob
        piece = f"{answer.rid}-r{done}" if done else answer.rid
        body: dict[str, Any] = dict(extra or {})
        body.update(
            token_ids=answer.prompt_ids + answer.ids,
            sampling_params=sampling,
            request_id=piece,
            output_mode="text",
            return_token_ids=True,
            stream=stream,
        )
        return body

    async def _retracted(self, answer: _Answer, params: dict[str, Any]) -> bool:
        """Asked once per piece: an ``abort`` this client did not ask for is a retract (a pause
        for a weight update; asking the engine whether it is paused would race with a fast
        ``/resume``), unless nothing is left to generate or the request was cut too often."""
        if answer.finish is None or answer.finish.type != "abort" or answer.retracted:
            return answer.retracted
        left = params.get("max_tokens")
        caller = answer.rid in self._caller_aborts or self._abort_paused
        spent = left is not None and int(left) <= len(answer.ids)
        answer.retracted = not (caller or spent or answer.pieces >= MAX_PIECES)
        return answer.retracted

    async def _resubmit(self, answer: _Answer, params: dict[str, Any]) -> bool:
        """Start the next piece of a retracted request; ``False`` when the answer is final."""
        if not await self._retracted(answer, params):
            self._caller_aborts.discard(answer.rid)
            return False
        answer.next_piece()
        return True

    # --- scheduling control ------------------------------------------------------------------

    async def pause_generation(self, mode: PauseMode = "abort") -> dict[str, Any]:
        """``in_place`` keeps requests frozen; ``retract`` and ``abort`` end them (this client
        resubmits a retracted one) and drop the prefix cache, which holds the old weights' keys
        (after an in_place update, ``update_weights_from_disk`` drops what it can)."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode must be one of {PAUSE_MODES}, got {mode!r}")
        # keep must not clear the cache: vLLM then completes the pause only once the engine is
        # idle, i.e. it lets the frozen requests run to their end on the old weights first.
        keep = "mode=keep&clear_cache=false"
        query = keep if mode == "in_place" else "mode=abort&clear_cache=true"
        self._abort_paused = mode == "abort"
        result: dict[str, Any] = await self._post_json(f"/pause?{query}", None)
        return result

    async def continue_generation(self) -> dict[str, Any]:
        self._abort_paused = False
        result: dict[str, Any] = await self._post_json("/resume", None)
        return result

    async def abort_request(self, rid: str | None = None, abort_all: bool = False) -> None:
        if rid is None and not abort_all:
            raise ValueError("abort_request needs a rid or abort_all=True")
        if abort_all:
            await self._post_json("/abort_requests", {"request_ids": []})
            return
        assert rid is not None
        self._caller_aborts.add(rid)
        await self._post_json("/abort_requests", {"request_ids": [RID_PREFIX + rid]})

    async def flush_cache(self) -> bool:
        result = await self._post_json("/reset_prefix_cache", None)
        return bool(result.get("success"))

    # --- weights -----------------------------------------------------------------------------

    async def update_weights_from_disk(
        self,
        model_path: str,
        weight_version: str | None = None,
        abort_all_requests: bool = False,
        load_format: str | None = None,
    ) -> dict[str, Any]:
        """vLLM's ``reload_weights`` on every worker (``/collective_rpc``, through areal's worker
        extension, which keeps tied weights tied), then the prefix cache is dropped and the new
        version set."""
        if load_format is not None:
            raise ValueError("vLLM reloads the checkpoint's own format; load_format is SGLang's")
        if abort_all_requests:
            await self.abort_request(abort_all=True)
        await self._rpc("areal_reload_weights", {"weights_path": model_path})
        await self.flush_cache()  # refused while frozen requests hold blocks: they keep theirs
        if weight_version is not None:
            await self.update_weight_version(weight_version, abort_all_requests=False)
        return {"success": True, "message": f"reloaded {model_path}"}

    async def update_weight_version(
        self, new_version: str, abort_all_requests: bool = True
    ) -> dict[str, Any]:
        if abort_all_requests:
            await self.abort_request(abort_all=True)
        return self._check_success(
            "/update_weight_version",
            await self._post_json("/update_weight_version", {"new_version": new_version}),
        )

    # --- the collective weight sync, through areal's worker extension -------------------------

    async def init_weights_update_group(
        self,
        *,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str = "weight_update_group",
        backend: str = "nccl",
    ) -> dict[str, Any]:
        """Every worker joins the trainer's group (SGLang's scheme), as ``rank_offset`` plus its
        tensor-parallel rank; the call returns once all have."""
        kwargs = {
            "master_address": master_address,
            "master_port": master_port,
            "rank_offset": rank_offset,
            "world_size": world_size,
            "group_name": group_name,
            "backend": backend,
        }
        await self._rpc("areal_init_weights_update_group", kwargs)
        return {"success": True, "message": f"joined {group_name}"}

    async def update_weights_from_distributed(
        self,
        *,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str = "weight_update_group",
        flush_cache: bool = True,
        abort_all_requests: bool = False,
        weight_version: str | None = None,
        load_format: str | None = None,
    ) -> dict[str, Any]:
        """One bucket, received by broadcast while rank 0 sends it. vLLM reloads a sync's
        buckets as one checkpoint (a layer is processed once all its weights came, whichever
        buckets held them), so the bucket that ends the sync must say so: the one with
        ``weight_version`` or ``flush_cache`` (the trainer's last; the earlier ones pass
        ``flush_cache=False``). Then the prefix cache is dropped and the version set, as after
        a reload from disk."""
        if load_format not in (None, "flattened_bucket"):
            raise ValueError(f"load_format {load_format!r}: vLLM takes tensors or one flat bucket")
        if abort_all_requests:
            await self.abort_request(abort_all=True)
        finish = flush_cache or weight_version is not None
        kwargs = {
            "group_name": group_name,
            "names": names,
            "dtypes": dtypes,
            "shapes": shapes,
            "flattened": load_format == "flattened_bucket",
            "finish": finish,
        }
        await self._rpc("areal_update_weights_from_distributed", kwargs)
        if finish:
            await self.flush_cache()
        if weight_version is not None:
            await self.update_weight_version(weight_version, abort_all_requests=False)
        return {"success": True, "message": f"loaded {len(names)} tensors"}

    async def destroy_weights_update_group(
        self, group_name: str = "weight_update_group"
    ) -> dict[str, Any]:
        await self._rpc("areal_destroy_weights_update_group", {"group_name": group_name})
        return {"success": True, "message": f"left {group_name}"}

    async def _rpc(self, method: str, kwargs: dict[str, Any]) -> Any:
        """A method of areal's worker extension on every worker (``/collective_rpc``)."""
        return await self._post_json("/collective_rpc", {"method": method, "kwargs": kwargs})
