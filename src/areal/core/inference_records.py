"""The records of the inference wire: sampling params in, generated tokens out.

Every backend's client (the SGLang-native one, vLLM's) answers in these terms, and the gateway,
the run and the trainer's weight sync read only them, so none of them learns which backend runs.
The wire shapes are those of docs/inference.md; the clients live with their backends in
``areal.plugins.inference``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

StreamChunking = Literal["auto", "cumulative", "incremental"]
PauseMode = Literal["abort", "retract", "in_place"]
PAUSE_MODES = ("abort", "retract", "in_place")


class InferenceError(Exception):
    """An inference server refused or failed a request.

    ``status_code`` is ``None`` when no HTTP answer came back (connection refused, timeout).
    """

    def __init__(
        self,
        status_code: int | None,
        message: str,
        url: str,
        *,
        err_type: str | None = None,
        retryable: bool | None = None,
    ) -> None:
        self.status_code = status_code
        self.message = message
        self.url = url
        self.err_type = err_type
        self.retryable = retryable
        status = f"HTTP {status_code}" if status_code is not None else "no response"
        super().__init__(f"{url}: {status}: {message}")


# --- request and response records ----------------------------------------------------------


@dataclass(kw_only=True)
class SamplingParams:
    """SGLang ``sampling_params``; fields left ``None`` are not sent, so the server default holds."""

    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    no_stop_trim: bool | None = None
    skip_special_tokens: bool | None = None
    sampling_seed: int | None = None
    json_schema: str | dict[str, Any] | None = None
    regex: str | None = None
    ebnf: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if v is not None}
        if isinstance(out.get("json_schema"), dict):
            # SGLang takes the schema as a JSON string.
            out["json_schema"] = json.dumps(out["json_schema"])
        return out


@dataclass(frozen=True)
class FinishReason:
    """Why a generation ended: ``type`` is ``"stop"``, ``"length"`` or ``"abort"``.

    ``matched`` is the stop token id or stop string that ended a ``"stop"``.
    """

    type: str
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Any) -> FinishReason | None:
        if data is None:
            return None
        if isinstance(data, str):  # OpenAI-style servers send a bare string
            return cls(type=data, raw={"type": data})
        return cls(
            type=str(data.get("type", "")),
            matched=data.get("matched"),
            length=data.get("length"),
            message=data.get("message"),
            raw=dict(data),
        )


@dataclass(frozen=True)
class WeightVersionSpan:
    """Output tokens ``[start, end)`` were sampled with weights ``version``."""

    version: str
    start: int
    end: int


class UnknownTokenVersionsError(ValueError):
    """The server did not say which weights sampled each token (no ``weight_versions`` spans)."""


@dataclass
class GenerateOutput:
    """One ``/generate`` answer (or, while streaming, everything generated so far).

    ``delta_*`` hold what the latest stream chunk added; for a non-streamed answer they equal the
    whole output. ``spans_known`` is false when the server sent no ``weight_versions`` key
    (SGLang before spans: only the final ``weight_version``); an empty list means no change.
    """

    output_ids: list[int]
    text: str | None = None
    output_logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    rid: str | None = None
    weight_version: str = "default"
    weight_versions: list[WeightVersionSpan] = field(default_factory=list)
    prompt_token_ids: list[int] | None = None
    meta_info: dict[str, Any] = field(default_factory=dict)
    delta_output_ids: list[int] = field(default_factory=list)
    delta_logprobs: list[float] = field(default_factory=list)
    delta_text: str = ""
    spans_known: bool = True

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def aborted(self) -> bool:
        return self.finish_reason is not None and self.finish_reason.type == "abort"

    def token_versions(self, default: str | None = None) -> list[str]:
        """The weight version that sampled each output token.

        Tokens inside a ``weight_versions`` span get that span's version; the others get
        ``default``, or ``weight_version`` when ``default`` is ``None`` (no spans means the
        weights did not change during the request). Without spans at all (``spans_known``
        false) the final version may not be the one that sampled early tokens, so this raises
        :class:`UnknownTokenVersionsError` rather than mislabel them; streaming derives spans.
        """
        n = len(self.output_ids)
        if not self.spans_known and n:
            raise UnknownTokenVersionsError(
                "the server sent no meta_info.weight_versions, only the final weight_version "
                f"({self.weight_version!r}), so the weights that sampled each of the {n} tokens "
                "are unknown: stream the request (spans come from each chunk's version) or run "
                "an SGLang that reports weight_versions"
            )
        fallback = self.weight_version if default is None else default
        versions = [fallback] * n
        for span in self.weight_versions:
            for i in range(max(0, span.start), min(n, span.end)):
                versions[i] = span.version
        return versions

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GenerateOutput:
        meta = dict(data.get("meta_info") or {})
        output_ids = [int(t) for t in data.get("output_ids") or []]
        logprobs = logprob_values(meta.get("output_token_logprobs"))
        text = data.get("text")
        return cls(
            output_ids=output_ids,
            text=text,
            output_logprobs=logprobs,
            **output_fields(data, meta, len(output_ids)),
            delta_output_ids=list(output_ids),
            delta_logprobs=list(logprobs),
            delta_text=text or "",
        )


def output_fields(data: Mapping[str, Any], meta: dict[str, Any], n_ids: int) -> dict[str, Any]:
    """The fields of :class:`GenerateOutput` read from ``meta_info`` (and the prompt ids)."""
    prompt_ids = data.get("prompt_token_ids")
    return {
        "finish_reason": FinishReason.from_json(meta.get("finish_reason")),
        "prompt_tokens": int(meta.get("prompt_tokens") or 0),
        "completion_tokens": int(meta.get("completion_tokens") or n_ids),
        "cached_tokens": int(meta.get("cached_tokens") or 0),
        "rid": meta.get("id"),
        "weight_version": str(meta.get("weight_version", "default")),
        "weight_versions": [
            WeightVersionSpan(str(s["version"]), int(s["start"]), int(s["end"]))
            for s in meta.get("weight_versions") or []
        ],
        "prompt_token_ids": None if prompt_ids is None else [int(t) for t in prompt_ids],
        "meta_info": meta,
        "spans_known": "weight_versions" in meta,
    }


def logprob_values(triples: Any) -> list[float]:
    """``[[logprob, token_id, text], ...]`` → logprobs; a missing value becomes NaN."""
    if not triples:
        return []
    return [math.nan if t[0] is None else float(t[0]) for t in triples]


# --- stream reassembly -----------------------------------------------------------------------


class TextPieces:
    """Text that grows piece by piece, joined only when someone reads it.

    A stream's cumulative text rebuilt on every chunk costs O(n) per chunk, O(n²) per stream;
    readers that need every step take ``delta_text`` instead.
    """

    def __init__(self) -> None:
        self.parts: list[str] = []
        self._joined = ""  # "".join(parts[:_count])
        self._count = 0

    def add(self, piece: str) -> None:
        if piece:
            self.parts.append(piece)

    def upto(self, count: int) -> str:
        """The text of the first ``count`` pieces."""
        if count < self._count:  # an older output read late
            return "".join(self.parts[:count])
        if count > self._count:
            self._joined += "".join(self.parts[self._count : count])
            self._count = count
        return self._joined


class StreamOutput(GenerateOutput):
    """A stream's output so far. ``output_ids`` and ``output_logprobs`` are the stream's own
    lists, which keep growing after this output is yielded (copying them on every chunk would
    cost O(n²) per stream): copy them to keep a snapshot. ``text`` is joined when read."""

    _pieces: tuple[TextPieces, int] | None = None
    _text: str | None = None

    @property  # type: ignore[override]
    def text(self) -> str | None:
        if self._pieces is not None:
            pieces, count = self._pieces
            return pieces.upto(count)
        return self._text

    @text.setter
    def text(self, value: str | None) -> None:
        self._text, self._pieces = value, None

    def snapshot(self) -> GenerateOutput:
        """A plain copy that stays as it is now (O(n): for tests and rare readers)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(GenerateOutput)}
        fields.update(output_ids=list(self.output_ids), output_logprobs=list(self.output_logprobs))
        return GenerateOutput(**fields)

    def text_from(self, pieces: TextPieces) -> StreamOutput:
        """Read ``text`` from ``pieces`` as they are now (without joining them yet)."""
        self._pieces = (pieces, len(pieces.parts))
        return self


def coalesced(outs: list[GenerateOutput]) -> GenerateOutput:
    """The last of consecutive stream outputs, its ``delta_*`` extended to what all of them
    added (the outputs are the stream's own, made per chunk: the last is changed in place)."""
    last = outs[-1]
    if len(outs) > 1:
        last.delta_output_ids = [t for out in outs for t in out.delta_output_ids]
        last.delta_logprobs = [lp for out in outs for lp in out.delta_logprobs]
        last.delta_text = "".join(out.delta_text for out in outs)
    return last
