"""Async client for the SGLang native HTTP API (the wire shapes of docs/inference.md).

One client speaks to real ``sglang.launch_server`` and to areal's embedded engine alike, so the
rollout code, the gateway and the trainer's weight-sync never care which backend runs.

Streaming and chunking. SGLang streams ``/generate`` as SSE ``data: {...}`` lines ending with
``data: [DONE]``. By default (0.5.x) each chunk carries the *whole* output so far (``output_ids``,
``text``, ``meta_info.output_token_logprobs``); with ``--incremental-streaming-output`` it carries
only the new part. ``meta_info.completion_tokens`` is cumulative in both modes, which makes the mode
detectable: ``stream_chunking="auto"`` (the default) compares each chunk's length with that count,
falls back to a prefix test when the count is missing, and remembers the answer for the rest of the
stream. Pass ``"cumulative"`` or ``"incremental"`` to skip detection. Whatever the server sends,
:meth:`InferenceClient.generate_stream` yields cumulative outputs plus the ``delta_*`` of each
chunk, in time linear in what the chunks carry: the cumulative lists are the stream's own (they
keep growing after a chunk is yielded) and the cumulative text is joined only when read, so a
reader that follows every step should take the ``delta_*``.

HTTP goes through aiohttp, areal's one HTTP stack. The session is made on first use, inside the
running event loop, so a client can be built anywhere (a config, a constructor) and used later.

Its records (:mod:`areal.core.inference_records`) are backend-neutral and live in the kernel; this
client is the SGLang backend's (the embedded engine speaks the same API), torch-free like them.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from areal.core.inference_records import (
    PAUSE_MODES,
    GenerateOutput,
    InferenceError,
    PauseMode,
    SamplingParams,
    StreamChunking,
    StreamOutput,
    TextPieces,
    WeightVersionSpan,
    logprob_values,
    output_fields,
)
from areal.host import fast_json

_CHUNKINGS = ("auto", "cumulative", "incremental")

# What aiohttp raises when no (whole) HTTP answer came back: refused or reset connections, broken
# or malformed responses, and timeouts (a total timeout raises a bare ``asyncio.TimeoutError``).
_TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


class _StreamAssembler:
    """Turns SSE chunks, cumulative or incremental, into cumulative :class:`StreamOutput`, in
    time linear in what each chunk carries: lists grow in place and text is joined on demand."""

    def __init__(self, chunking: StreamChunking) -> None:
        self.chunking = chunking
        self.ids_mode: str | None = None if chunking == "auto" else chunking
        self.text_mode: str | None = None if chunking == "auto" else chunking
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.whole: str | None = None  # the text so far, while the text is read as cumulative
        self.sent = ""  # what delta_text has said of ``whole``
        self.pieces: TextPieces | None = None  # the text, once it is read as incremental
        self.spans: list[WeightVersionSpan] = []  # from chunk versions, when the server sends none

    def add(self, data: Mapping[str, Any]) -> StreamOutput:
        """The output after one more chunk."""
        return self.add_all([data])

    def add_all(self, chunks: list[Mapping[str, Any]]) -> StreamOutput:
        """The output after ``chunks`` (at least one), its ``delta_*`` what they all added:
        one output is built however many chunks arrived together."""
        ids_from, logprobs_from = len(self.ids), len(self.logprobs)
        texts = [self._take(data) for data in chunks]
        data = chunks[-1]
        meta = dict(data.get("meta_info") or {})
        out = StreamOutput(
            output_ids=self.ids,
            output_logprobs=self.logprobs,
            **output_fields(data, meta, len(self.ids)),
            delta_output_ids=self.ids[ids_from:],
            delta_logprobs=self.logprobs[logprobs_from:],
            delta_text=texts[0] if len(texts) == 1 else "".join(texts),
        )
        out.text = self.whole
        if self.pieces is not None:
            out.text_from(self.pieces)
        if not out.spans_known:
            out.weight_versions, out.spans_known = list(self.spans), True
        return out

    def _take(self, data: Mapping[str, Any]) -> str:
        """Grow the ids, log-probs, text and spans by one chunk; return the text it adds."""
        meta = data.get("meta_info") or {}
        chunk_ids = data.get("output_ids")
        if chunk_ids is not None:
            chunk_ids = [int(t) for t in chunk_ids]
            mode = self._ids_mode(chunk_ids, meta.get("completion_tokens"))
            self.ids.extend(chunk_ids[len(self.ids) :] if mode == "cumulative" else chunk_ids)
        triples = meta.get("output_token_logprobs")
        if triples is not None:
            self._add_logprobs(triples)
        delta_text = ""
        if data.get("text") is not None:
            delta_text = self._add_text(str(data["text"]), meta.get("finish_reason") is not None)
        if "weight_versions" not in meta:  # the server sends no spans: each chunk's version
            self._chunk_spans(str(meta.get("weight_version", "default")))
        return delta_text

    def _add_logprobs(self, triples: list[Any]) -> list[float]:
        """Extend the log-probs by what this chunk adds. They follow the ids' chunking; their
        length against the new id count decides, and the ids' mode breaks a tie."""
        have, total = len(self.logprobs), len(self.ids)
        if len(triples) == total:
            new = logprob_values(triples[have:])
        elif have + len(triples) == total or self.ids_mode == "incremental":
            new = logprob_values(triples)
        else:  # cumulative, but not as long as the ids: take it as it is
            values = logprob_values(triples)
            self.logprobs[:] = values
            return values[have:] if len(values) >= have else values
        self.logprobs.extend(new)
        return new

    def _add_text(self, chunk: str, finished: bool) -> str:
        """Take the chunk's text; return what it adds. Cumulative text that ends in a partial
        UTF-8 character (U+FFFD, completed by a later chunk) is held back from the delta."""
        if self._text_mode(chunk) == "cumulative":
            self.whole = chunk
            stable = chunk if finished else chunk.rstrip("\ufffd")
            if len(stable) <= len(self.sent) or not stable.startswith(self.sent):
                return ""  # nothing new, or decoding changed earlier text: say nothing new
            delta, self.sent = stable[len(self.sent) :], stable
            return delta
        if self.pieces is None:  # the first chunk was read as the whole text: it was a piece
            whole, self.whole, self.pieces = self.whole or "", None, TextPieces()
            self.pieces.add(whole)
            self.pieces.add(chunk)
            return whole[len(self.sent) :] + chunk  # with what was held back of the first
        self.pieces.add(chunk)
        return chunk

    def _chunk_spans(self, version: str) -> None:
        """Extend the spans by a chunk's ``weight_version``: the version its new tokens were
        made at."""
        n = len(self.ids)
        start = self.spans[-1].end if self.spans else 0
        if n > start:
            last = self.spans[-1] if self.spans else None
            if last is not None and last.version == version:
                self.spans[-1] = WeightVersionSpan(last.version, last.start, n)
            else:
                self.spans.append(WeightVersionSpan(version, start, n))

    def _ids_mode(self, chunk: list[int], count: Any) -> str:
        if self.chunking != "auto":
            return self.chunking
        acc = self.ids
        if isinstance(count, int):
            # completion_tokens is cumulative in both modes: the one trustworthy signal.
            if len(chunk) == count:
                return self._lock_ids("cumulative")
            if len(acc) + len(chunk) == count:
                return self._lock_ids("incremental")
        if self.ids_mode is not None:
            return self.ids_mode
        if not acc:
            return "cumulative"  # both readings agree on the first chunk
        return self._lock_ids("cumulative" if chunk[: len(acc)] == acc else "incremental")

    def _lock_ids(self, mode: str) -> str:
        if self.ids:
            self.ids_mode = mode
        return mode

    def _text_mode(self, chunk: str) -> str:
        if self.text_mode is not None:
            return self.text_mode
        if self.ids_mode is not None:  # text is chunked as the ids are, and their test is exact
            return self.ids_mode
        # A trailing partial UTF-8 character (U+FFFD) may come back completed in the next chunk.
        acc = (self.whole or "").rstrip("\ufffd")
        if not acc:
            return "cumulative"
        if not chunk.startswith(acc):
            self.text_mode = "incremental"
            return "incremental"
        # A chunk that starts with all the text so far is ambiguous; trust the ids' evidence.
        return self.ids_mode or "cumulative"


async def _line_batches(chunks: AsyncIterator[bytes]) -> AsyncIterator[list[str]]:
    """Split a byte stream into lines at ``\\n``, ``\\r\\n`` or ``\\r``, however long a line is:
    the lines each read completed, one list per read.

    aiohttp's own line iterator refuses lines longer than its read buffer (128 KiB), and one
    cumulative SSE chunk of a long generation with log-probs is longer than that.
    """
    pending: list[bytes] = []
    async for chunk in chunks:
        if b"\n" not in chunk and b"\r" not in chunk:
            pending.append(chunk)
            continue
        lines = b"".join([*pending, chunk]).splitlines(keepends=True)
        pending = []
        if not lines[-1].endswith(b"\n"):  # unfinished, or a "\r" whose "\n" may come next
            pending.append(lines.pop())
        yield [line.rstrip(b"\r\n").decode("utf-8", errors="replace") for line in lines]
    rest = b"".join(pending).splitlines()
    if rest:
        yield [line.decode("utf-8", errors="replace") for line in rest]


def _sse_data(line: str) -> str | None:
    if not line.startswith("data:"):
        return None  # blank separators, comments, event: lines
    return line[5:].strip()


_DONE = object()  # the stream's ``[DONE]``


def _sse_chunk(line: str, url: str) -> Any:
    """The JSON of a ``data:`` line; None for other lines, ``_DONE`` at the end."""
    payload = _sse_data(line)
    if not payload:
        return None
    if payload == "[DONE]":
        return _DONE
    try:
        data = fast_json.loads_engine(payload)
    except json.JSONDecodeError as exc:
        raise InferenceError(200, f"bad stream chunk {payload[:200]!r}", url) from exc
    if isinstance(data, dict) and "error" in data:
        raise _stream_error(data, url)
    return data


# --- responses and errors --------------------------------------------------------------------


@dataclass(frozen=True)
class _Response:
    """A whole HTTP answer, read before its connection went back to the pool."""

    status_code: int
    reason: str
    url: str
    content: bytes
    charset: str | None

    @property
    def text(self) -> str:
        try:
            return self.content.decode(self.charset or "utf-8", errors="replace")
        except LookupError:  # a charset Python does not know
            return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


async def _read(response: aiohttp.ClientResponse, url: str) -> _Response:
    content = await response.read()
    return _Response(response.status, response.reason or "", url, content, response.charset)


def _transport_error(exc: BaseException, url: str) -> InferenceError:
    detail = str(exc)
    name = type(exc).__name__
    return InferenceError(None, f"{name}: {detail}" if detail else name, url)


def _error_from_response(response: _Response) -> InferenceError:
    try:
        body: Any = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
        body = None
    message, err_type, retryable = _error_fields(body)
    if message is None:
        message = response.text.strip() or response.reason or "error"
    return InferenceError(
        response.status_code, message, response.url, err_type=err_type, retryable=retryable
    )


def _error_fields(body: Any) -> tuple[str | None, str | None, bool | None]:
    """Read SGLang's ``{"error": {"message", "type", "retryable"}}`` and the usual variants."""
    if not isinstance(body, dict):
        return None, None, None
    err = body.get("error")
    if isinstance(err, dict) and err.get("message") is not None:
        retryable = err.get("retryable")
        return (
            str(err["message"]),
            err.get("type"),
            retryable if isinstance(retryable, bool) else None,
        )
    if isinstance(err, str):
        return err, None, None
    for key in ("message", "detail"):
        value = body.get(key)
        if value is not None:
            return (value if isinstance(value, str) else json.dumps(value)), None, None
    return None, None, None


# --- the client ------------------------------------------------------------------------------


class InferenceClient:
    """Async client for one inference server (SGLang or the embedded engine).

    ``trust_env`` is off by default: engines sit on the cluster network or on 127.0.0.1, where an
    ``HTTP_PROXY`` meant for the internet would only get in the way.

    ``timeout`` bounds each wait (for a free connection, for the answer, between two stream
    chunks), not a whole request, so a long stream that keeps producing is never cut off;
    ``connect_timeout`` bounds opening a TCP connection. ``None`` waits forever.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float | None = 600.0,
        connect_timeout: float = 10.0,
        max_connections: int = 1024,
        stream_chunking: StreamChunking = "auto",
        trust_env: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if stream_chunking not in _CHUNKINGS:
            raise ValueError(
                f"stream_chunking must be one of {_CHUNKINGS}, got {stream_chunking!r}"
            )
        self.base_url = base_url.rstrip("/")
        self.stream_chunking: StreamChunking = stream_chunking
        self._headers = dict(headers or {})
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = aiohttp.ClientTimeout(
            connect=timeout, sock_connect=connect_timeout, sock_read=timeout
        )
        self._max_connections = max_connections
        self._trust_env = trust_env
        self._http: aiohttp.ClientSession | None = None
        self._closed = False

    async def __aenter__(self) -> InferenceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        if self._http is not None:
            await self._http.close()

    def __repr__(self) -> str:
        return f"InferenceClient({self.base_url!r})"

    # --- plumbing ----------------------------------------------------------------------------

    def _session(self) -> aiohttp.ClientSession:
        """The aiohttp session, made on first use: it must be made inside the running loop."""
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        if self._http is None:
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections),
                headers=self._headers,
                timeout=self._timeout,
                trust_env=self._trust_env,
            )
        return self._http

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        allow_status: tuple[int, ...] = (),
    ) -> _Response:
        url = self.base_url + path
        try:
            async with self._session().request(
                method, url, json=json_body, allow_redirects=False
            ) as answer:
                response = await _read(answer, url)
        except _TRANSPORT_ERRORS as exc:
            raise _transport_error(exc, url) from exc
        if response.status_code >= 400 and response.status_code not in allow_status:
            raise _error_from_response(response)
        return response

    async def _post_json(self, path: str, body: Any) -> Any:
        return _json(await self._request("POST", path, json_body=body))

    # --- info and health ---------------------------------------------------------------------

    async def health(self, timeout: float = 5.0) -> bool:
        """True when ``GET /health`` answers 200 (503 while starting or shutting down)."""
        try:
            async with self._session().get(
                self.base_url + "/health",
                timeout=aiohttp.ClientTimeout(total=timeout),
                allow_redirects=False,
            ) as response:
                await response.read()
                return response.status == 200
        except _TRANSPORT_ERRORS:
            return False

    async def wait_healthy(self, timeout: float, interval: float = 0.5) -> None:
        """Poll ``/health`` until it answers 200; ``TimeoutError`` naming the URL otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if await self.health(timeout=max(0.1, min(5.0, remaining))):
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"inference server at {self.base_url} was not healthy after {timeout:g}s "
                    f"(polled {self.base_url}/health)"
                )
            await asyncio.sleep(min(interval, max(0.0, deadline - time.monotonic())))

    async def model_info(self) -> dict[str, Any]:
        """``GET /model_info``; older servers only know the ``/get_model_info`` alias."""
        return await self._get_with_alias("/model_info", "/get_model_info")

    async def server_info(self) -> dict[str, Any]:
        """``GET /server_info`` (alias ``/get_server_info``)."""
        return await self._get_with_alias("/server_info", "/get_server_info")

    async def _get_with_alias(self, path: str, alias: str) -> dict[str, Any]:
        response = await self._request("GET", path, allow_status=(404,))
        if response.status_code == 404:
            response = await self._request("GET", alias)
        return _json(response)

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
        """One ``POST /generate``; ``extra`` adds other ``GenerateReqInput`` fields as they are."""
        body = _generate_body(input_ids, text, sampling_params, return_logprob, rid, extra, False)
        data = _json(await self._request("POST", "/generate", json_body=body))
        if isinstance(data, list):  # a server may answer a single request as a batch of one
            data = data[0]
        return GenerateOutput.from_json(data)

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
        """Streaming ``POST /generate``: yields the cumulative output after each chunk.

        The outputs share the stream's growing ``output_ids`` and ``output_logprobs`` (see
        :class:`StreamOutput`); ``delta_*`` hold what each chunk added. With ``coalesce``, the
        chunks that arrived together (one network read) yield one output, whose ``delta_*`` hold
        what they all added: a reader that fell behind the engine catches up in one step, not one
        per token (what vLLM's API server does for a slow client).

        A consumer that may stop early should wrap it in ``contextlib.aclosing`` so the
        connection is released at once rather than when the generator is collected.
        """
        body = _generate_body(input_ids, text, sampling_params, return_logprob, rid, extra, True)
        assembler = _StreamAssembler(stream_chunking or self.stream_chunking)
        last: GenerateOutput | None = None
        async for batch in self._sse_batches("/generate", body):
            if coalesce:
                last = assembler.add_all(batch)
                yield last
                continue
            for data in batch:  # each yielded before the next grows the shared lists
                last = assembler.add(data)
                yield last
        if last is None or not last.finished:
            url = self.base_url + "/generate"
            raise InferenceError(None, "stream ended before the request finished", url)

    async def _sse_events(self, path: str, body: Any) -> AsyncIterator[Any]:
        """``POST path`` and yield each SSE ``data:`` chunk as JSON until ``[DONE]``."""
        async for batch in self._sse_batches(path, body):
            for data in batch:
                yield data

    async def _sse_batches(self, path: str, body: Any) -> AsyncIterator[list[Any]]:
        """``POST path`` and yield the SSE ``data:`` chunks as JSON until ``[DONE]``, those of
        one network read together; an error status, an ``error`` chunk, a bad chunk or a broken
        connection is an InferenceError."""
        url = self.base_url + path
        try:
            async with self._session().post(url, json=body, allow_redirects=False) as response:
                if response.status >= 400:
                    raise _error_from_response(await _read(response, url))
                async for lines in _line_batches(response.content.iter_any()):
                    batch: list[Any] = []
                    for line in lines:
                        try:
                            data = _sse_chunk(line, url)
                        except InferenceError:
                            if batch:  # what came before the bad chunk is delivered first
                                yield batch
                            raise
                        if data is _DONE:
                            if batch:
                                yield batch
                            return
                        if data is not None:
                            batch.append(data)
                    if batch:
                        yield batch
        except _TRANSPORT_ERRORS as exc:
            raise _transport_error(exc, url) from exc

    # --- scheduling control ------------------------------------------------------------------

    async def pause_generation(self, mode: PauseMode = "abort") -> dict[str, Any]:
        """Stop scheduling; ``abort`` ends in-flight requests with ``finish_reason`` abort."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode must be one of {PAUSE_MODES}, got {mode!r}")
        return await self._post_json("/pause_generation", {"mode": mode})

    async def continue_generation(self) -> dict[str, Any]:
        return await self._post_json("/continue_generation", {})

    async def abort_request(self, rid: str | None = None, abort_all: bool = False) -> None:
        """Abort one request by ``rid``, or every request; they finish with type ``abort``."""
        if rid is None and not abort_all:
            raise ValueError("abort_request needs a rid or abort_all=True")
        await self._request(
            "POST", "/abort_request", json_body={"rid": rid or "", "abort_all": abort_all}
        )

    async def flush_cache(self) -> bool:
        """Drop the prefix cache; ``False`` when the server refuses because requests are running."""
        response = await self._request("POST", "/flush_cache", allow_status=(400,))
        return response.status_code == 200

    # --- weights -----------------------------------------------------------------------------

    async def update_weights_from_disk(
        self,
        model_path: str,
        weight_version: str | None = None,
        abort_all_requests: bool = False,
        load_format: str | None = None,
    ) -> dict[str, Any]:
        """Reload weights from a checkpoint dir; raises :class:`InferenceError` on failure."""
        body: dict[str, Any] = {"model_path": model_path, "abort_all_requests": abort_all_requests}
        if weight_version is not None:
            body["weight_version"] = weight_version
        if load_format is not None:
            body["load_format"] = load_format
        return self._check_success(
            "/update_weights_from_disk", await self._post_json("/update_weights_from_disk", body)
        )

    async def update_weight_version(
        self, new_version: str, abort_all_requests: bool = True
    ) -> dict[str, Any]:
        body = {"new_version": new_version, "abort_all_requests": abort_all_requests}
        return self._check_success(
            "/update_weight_version", await self._post_json("/update_weight_version", body)
        )

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
        """Join the trainer's broadcast group (NCCL to SGLang on GPUs, gloo to the embedded engine)."""
        body = {
            "master_address": master_address,
            "master_port": master_port,
            "rank_offset": rank_offset,
            "world_size": world_size,
            "group_name": group_name,
            "backend": backend,
        }
        return self._check_success(
            "/init_weights_update_group", await self._post_json("/init_weights_update_group", body)
        )

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
        """Receive tensors the trainer broadcasts from rank 0 while this call is in flight."""
        body: dict[str, Any] = {
            "names": names,
            "dtypes": dtypes,
            "shapes": shapes,
            "group_name": group_name,
            "flush_cache": flush_cache,
            "abort_all_requests": abort_all_requests,
        }
        if weight_version is not None:
            body["weight_version"] = weight_version
        if load_format is not None:
            body["load_format"] = load_format
        path = "/update_weights_from_distributed"
        return self._check_success(path, await self._post_json(path, body))

    async def destroy_weights_update_group(
        self, group_name: str = "weight_update_group"
    ) -> dict[str, Any]:
        path = "/destroy_weights_update_group"
        return self._check_success(path, await self._post_json(path, {"group_name": group_name}))

    def _check_success(self, path: str, data: Any) -> dict[str, Any]:
        if isinstance(data, dict) and data.get("success") is False:
            raise InferenceError(200, str(data.get("message", "failed")), self.base_url + path)
        return data if isinstance(data, dict) else {"result": data}


def _generate_body(
    input_ids: list[int] | None,
    text: str | None,
    sampling_params: SamplingParams | Mapping[str, Any] | None,
    return_logprob: bool,
    rid: str | None,
    extra: Mapping[str, Any] | None,
    stream: bool,
) -> dict[str, Any]:
    if (input_ids is None) == (text is None):
        raise ValueError("generate needs exactly one of input_ids or text")
    if isinstance(sampling_params, SamplingParams):
        params = sampling_params.to_json()
    else:
        params = {k: v for k, v in dict(sampling_params or {}).items() if v is not None}
    body: dict[str, Any] = dict(extra or {})
    if input_ids is not None:
        body["input_ids"] = list(input_ids)
    else:
        body["text"] = text
    body.update(sampling_params=params, return_logprob=return_logprob, stream=stream)
    if rid is not None:
        body["rid"] = rid
    return body


def _stream_error(data: Mapping[str, Any], url: str) -> InferenceError:
    message, err_type, retryable = _error_fields(data)
    err = data.get("error")
    code = err.get("code") if isinstance(err, dict) else None
    return InferenceError(
        code if isinstance(code, int) else 400,
        message or "error",
        url,
        err_type=err_type,
        retryable=retryable,
    )


def _json(response: _Response) -> Any:
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
        raise InferenceError(
            response.status_code, f"expected JSON, got {response.text[:200]!r}", response.url
        ) from exc
