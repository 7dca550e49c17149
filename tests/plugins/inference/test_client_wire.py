"""InferenceClient against a real HTTP server that answers in SGLang's wire shapes.

SGLang itself needs a CUDA GPU, so the server here is a small aiohttp.web stand-in for SGLang written
from docs/inference.md; it runs on 127.0.0.1 in its own event loop on a thread. Tests against the embedded
engine and against real SGLang (bench/gpu/sglang_check.py) cover the real backends.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.web import Request, Response, StreamResponse, json_response

from areal.core.inference_records import (
    GenerateOutput,
    InferenceError,
    SamplingParams,
    StreamOutput,
    UnknownTokenVersionsError,
    WeightVersionSpan,
)
from areal.host.process import pick_free_port
from areal.plugins.inference.sglang_client import InferenceClient, _line_batches, _StreamAssembler

# --- the SGLang stand-in ---------------------------------------------------------------------


@dataclass
class StandIn:
    """Knobs and a request log of the SGLang stand-in; reset before every test."""

    chunking: str = "cumulative"  # how /generate streams: "cumulative" or "incremental"
    send_counts: bool = True  # put cumulative completion_tokens in stream chunks
    has_model_info: bool = True  # False: /model_info answers 404, as on older servers
    busy: bool = False  # /flush_cache answers 400 while requests run
    api_key: str | None = None
    weight_version: str = "default"
    old_sglang: bool = False  # True: no meta_info.weight_versions, as SGLang before spans
    versions_by_chunk: list[str] = field(default_factory=list)  # weight_version of stream chunk i
    fail_next: tuple[int, str, str] | None = None  # (status, body, media type) for the next call
    token_delay: float = 0.0  # seconds before each stream chunk (the wall-clock timeout test)
    # Set: a stream's next chunk leaves only once the test released it (one release per chunk
    # after the first), so the client reads each chunk before the next exists.
    lockstep: threading.Semaphore | None = None
    one_write: bool = False  # True: a stream's chunks leave in one write (a reader fell behind)
    # Cleared: /generate holds its answer until the test sets it again (a server that stalls).
    answering: threading.Event = field(default_factory=lambda: _set(threading.Event()))
    abort_event: threading.Event = field(default_factory=threading.Event)
    log: list[tuple[str, Any]] = field(default_factory=list)


def _set(event: threading.Event) -> threading.Event:
    event.set()
    return event


def _token_text(token: int) -> str:
    return f"<{token}>"


def _meta(state: StandIn, body: dict[str, Any], ids: list[int], finish: Any) -> dict[str, Any]:
    prompt = body.get("input_ids") or list(range(len(str(body.get("text", "")).split())))
    meta: dict[str, Any] = {
        "id": body.get("rid") or "rid-auto",
        "prompt_tokens": len(prompt),
        "completion_tokens": len(ids),
        "cached_tokens": 0,
        "finish_reason": finish,
        "weight_version": state.weight_version,
        "e2e_latency": 0.01,
    }
    if body.get("return_logprob"):
        meta["output_token_logprobs"] = [[-0.5 * (i + 1), t, None] for i, t in enumerate(ids)]
    if str(body.get("rid", "")).startswith("split"):
        meta["weight_versions"] = [
            {"version": "v1", "start": 0, "end": 2},
            {"version": "v2", "start": 2, "end": len(ids)},
        ]
    elif not state.old_sglang:  # SGLang 0.5.x: one span per version over every output token
        meta["weight_versions"] = [{"version": state.weight_version, "start": 0, "end": len(ids)}]
    return meta


def _plan(body: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
    params = body.get("sampling_params") or {}
    n = int(params.get("max_new_tokens", 4))
    ids = [100 + i for i in range(n)]
    stop_ids = params.get("stop_token_ids") or []
    for i, token in enumerate(ids):
        if token in stop_ids:
            return ids[: i + 1], {"type": "stop", "matched": token}
    return ids, {"type": "length", "length": n}


def build_app(state: StandIn) -> web.Application:
    def fail_or_auth(request: Request) -> Response | None:
        if state.fail_next is not None:
            status, content, media = state.fail_next
            state.fail_next = None
            return Response(text=content, status=status, content_type=media)
        if state.api_key and request.headers.get("authorization") != f"Bearer {state.api_key}":
            return json_response({"error": {"message": "Unauthorized", "code": 401}}, status=401)
        return None

    Handler = Callable[[Request], Awaitable[StreamResponse]]

    def endpoint(handler: Handler) -> Handler:
        async def wrapped(request: Request) -> StreamResponse:
            early = fail_or_auth(request)
            if early is not None:
                return early
            return await handler(request)

        return wrapped

    async def health(request: Request) -> Response:
        return Response(status=200)

    async def model_info(request: Request) -> Response:
        if request.path == "/model_info" and not state.has_model_info:
            return json_response({"detail": "Not Found"}, status=404)
        state.log.append(("model_info", request.path))
        return json_response(
            {
                "model_path": "/models/tiny",
                "is_generation": True,
                "weight_version": state.weight_version,
            }
        )

    async def generate(request: Request) -> StreamResponse:
        body = await request.json()
        state.log.append(("generate", body))
        if not state.answering.is_set():
            await asyncio.to_thread(state.answering.wait)
        if body.get("input_ids") == []:
            error = {
                "message": "The input_ids is empty.",
                "type": "invalid_request_error",
                "code": 400,
                "retryable": False,
            }
            return json_response({"error": error}, status=400)
        ids, finish = _plan(body)
        if not body.get("stream"):
            return json_response(
                {
                    "text": "".join(_token_text(t) for t in ids),
                    "output_ids": ids,
                    "meta_info": _meta(state, body, ids, finish),
                    "prompt_token_ids": body.get("input_ids"),
                }
            )
        response = StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if state.one_write:
            await response.write(b"".join([piece async for piece in stream(body, ids, finish)]))
        else:
            async for piece in stream(body, ids, finish):
                await response.write(piece)
                if body.get("rid") == "drop-mid-stream" and request.transport is not None:
                    request.transport.abort()  # the connection breaks mid-answer
                    return response
        await response.write_eof()
        return response

    async def stream(body: dict[str, Any], ids: list[int], finish: Any) -> AsyncIterator[bytes]:
        if body.get("rid") == "one-chunk":  # the whole answer in one (long) SSE line
            chunk = {"text": "".join(_token_text(t) for t in ids), "output_ids": ids}
            chunk["meta_info"] = _meta(state, body, ids, finish)
            yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
            return
        if body.get("rid") == "error-mid-stream":
            yield b'data: {"error": {"message": "boom in the scheduler"}}\n\n'
            yield b"data: [DONE]\n\n"
            return
        for i in range(1, len(ids) + 1):
            if state.lockstep is not None and i > 1:
                await asyncio.to_thread(state.lockstep.acquire)
            if state.token_delay:
                await asyncio.sleep(state.token_delay)
            done = i == len(ids)
            end_reason: Any = finish if done else None
            if state.abort_event.is_set():
                done, end_reason = True, {"type": "abort", "message": "paused", "status_code": None}
            so_far = ids[:i]
            if state.versions_by_chunk:  # the weights changed while this request ran
                state.weight_version = state.versions_by_chunk[i - 1]
            meta = _meta(state, body, so_far, end_reason)
            chunk: dict[str, Any] = {"text": "".join(_token_text(t) for t in so_far)}
            chunk["output_ids"] = so_far
            if state.chunking == "incremental":
                chunk = {"text": _token_text(ids[i - 1]), "output_ids": [ids[i - 1]]}
                if "output_token_logprobs" in meta:
                    meta["output_token_logprobs"] = meta["output_token_logprobs"][-1:]
            if not state.send_counts:
                meta.pop("completion_tokens")
            chunk["meta_info"] = meta
            yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
            if done:
                break
        yield b"data: [DONE]\n\n"

    async def pause(request: Request) -> Response:
        body = await request.json()
        state.log.append(("pause", body))
        if body.get("mode", "abort") == "abort":
            state.abort_event.set()
        return json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def resume(request: Request) -> Response:
        state.log.append(("continue", await request.json()))
        state.abort_event.clear()
        return json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def abort(request: Request) -> Response:
        state.log.append(("abort", await request.json()))
        return Response(status=200)

    async def flush(request: Request) -> Response:
        if state.busy:
            return Response(text="Cache not flushed: requests are running.", status=400)
        return Response(text="Cache flushed.")

    async def update_from_disk(request: Request) -> Response:
        body = await request.json()
        state.log.append(("update_weights_from_disk", body))
        if body["model_path"] == "/no/such/dir":
            return json_response(
                {"success": False, "message": "Failed to load weights: no such dir"}, status=400
            )
        if body.get("weight_version") is not None:
            state.weight_version = body["weight_version"]
        return json_response({"success": True, "message": "Succeeded.", "num_paused_requests": 0})

    async def update_version(request: Request) -> Response:
        body = await request.json()
        state.weight_version = body["new_version"]
        return json_response({"success": True, "message": "ok", "new_version": body["new_version"]})

    routes = [
        ("GET", "/health", health),
        ("GET", "/model_info", model_info),
        ("GET", "/get_model_info", model_info),
        ("POST", "/generate", generate),
        ("PUT", "/generate", generate),
        ("POST", "/pause_generation", pause),
        ("POST", "/continue_generation", resume),
        ("POST", "/abort_request", abort),
        ("GET", "/flush_cache", flush),
        ("POST", "/flush_cache", flush),
        ("POST", "/update_weights_from_disk", update_from_disk),
        ("POST", "/update_weight_version", update_version),
    ]
    app = web.Application()
    for method, path, handler in routes:
        app.router.add_route(method, path, endpoint(handler))
    return app


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[StandIn, str]]:
    state = StandIn()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="standin", daemon=True)
    thread.start()
    runner = web.AppRunner(build_app(state), access_log=None)

    async def start() -> int:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return int(runner.addresses[0][1])

    try:
        port = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
        yield state, f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


@pytest.fixture
def standin(server: tuple[StandIn, str]) -> tuple[StandIn, str]:
    state, url = server
    fresh = StandIn()
    for name in fresh.__dataclass_fields__:
        if name not in ("abort_event", "answering"):
            setattr(state, name, getattr(fresh, name))
    state.abort_event.clear()
    state.answering.set()
    return state, url


def run(url: str, scenario: Callable[[InferenceClient], Awaitable[Any]], **kwargs: Any) -> Any:
    async def main() -> Any:
        async with InferenceClient(url, **kwargs) as client:
            return await scenario(client)

    return asyncio.run(main())


async def collect(client: InferenceClient, **kwargs: Any) -> list[GenerateOutput]:
    """Each chunk as it was when yielded (a stream's cumulative lists keep growing)."""
    return [_snapshot(chunk) async for chunk in client.generate_stream(**kwargs)]


def _snapshot(out: GenerateOutput) -> GenerateOutput:
    return out.snapshot() if isinstance(out, StreamOutput) else out


# --- records ---------------------------------------------------------------------------------


def test_sampling_params_to_json_drops_none_and_serialises_schema() -> None:
    params = SamplingParams(
        max_new_tokens=8, temperature=0.0, stop=["\n"], json_schema={"type": "object"}
    )
    assert params.to_json() == {
        "max_new_tokens": 8,
        "temperature": 0.0,
        "stop": ["\n"],
        "json_schema": '{"type": "object"}',
    }
    assert SamplingParams().to_json() == {}


def test_token_versions_from_spans() -> None:
    out = GenerateOutput(
        output_ids=[1, 2, 3, 4, 5],
        weight_version="v3",
        weight_versions=[WeightVersionSpan("v1", 0, 2), WeightVersionSpan("v2", 2, 4)],
    )
    assert out.token_versions() == ["v1", "v1", "v2", "v2", "v3"]
    assert out.token_versions(default="?") == ["v1", "v1", "v2", "v2", "?"]
    assert GenerateOutput(output_ids=[1, 2], weight_version="7").token_versions() == ["7", "7"]


# --- generate --------------------------------------------------------------------------------


def test_generate_with_input_ids_parses_the_sglang_answer(standin: tuple[StandIn, str]) -> None:
    state, url = standin
    out = run(
        url,
        lambda c: c.generate(
            input_ids=[1, 2, 3], sampling_params=SamplingParams(max_new_tokens=3), rid="r1"
        ),
    )
    sent = state.log[-1][1]
    assert sent["input_ids"] == [1, 2, 3]
    assert sent["sampling_params"] == {"max_new_tokens": 3}
    assert sent["return_logprob"] is True and sent["stream"] is False and sent["rid"] == "r1"
    assert out.output_ids == [100, 101, 102]
    assert out.output_logprobs == [-0.5, -1.0, -1.5]
    assert out.text == "<100><101><102>"
    assert out.finish_reason is not None and out.finish_reason.type == "length"
    assert out.finish_reason.length == 3 and out.finished and not out.aborted
    assert (out.prompt_tokens, out.completion_tokens, out.rid) == (3, 3, "r1")
    assert out.weight_version == "default" and out.token_versions() == ["default"] * 3
    assert out.prompt_token_ids == [1, 2, 3]
    assert out.meta_info["e2e_latency"] == 0.01


def test_generate_with_text_and_stop_token(standin: tuple[StandIn, str]) -> None:
    state, url = standin
    out = run(
        url,
        lambda c: c.generate(
            text="hello there",
            sampling_params={"max_new_tokens": 8, "stop_token_ids": [101], "top_k": None},
            return_logprob=False,
        ),
    )
    sent = state.log[-1][1]
    assert sent["text"] == "hello there" and "input_ids" not in sent
    assert sent["sampling_params"] == {"max_new_tokens": 8, "stop_token_ids": [101]}
    assert out.output_ids == [100, 101] and out.output_logprobs == []
    assert out.finish_reason is not None
    assert (out.finish_reason.type, out.finish_reason.matched) == ("stop", 101)


def test_generate_needs_exactly_one_prompt() -> None:
    async def scenario(client: InferenceClient) -> None:
        with pytest.raises(ValueError, match="exactly one"):
            await client.generate(sampling_params={})
        with pytest.raises(ValueError, match="exactly one"):
            await client.generate(input_ids=[1], text="x", sampling_params={})

    run("http://127.0.0.1:9", scenario)


def test_weight_version_spans_become_per_token_versions(standin: tuple[StandIn, str]) -> None:
    _, url = standin
    out = run(
        url,
        lambda c: c.generate(input_ids=[1], sampling_params={"max_new_tokens": 5}, rid="split-1"),
    )
    assert out.weight_versions == [WeightVersionSpan("v1", 0, 2), WeightVersionSpan("v2", 2, 5)]
    assert out.token_versions() == ["v1", "v1", "v2", "v2", "v2"]


def test_an_answer_without_spans_refuses_to_label_its_tokens(standin: tuple[StandIn, str]) -> None:
    """Old SGLang sends only the final weight_version: labelling every token with it would be
    silently wrong when the weights changed mid-request, so token_versions raises."""
    state, url = standin
    state.old_sglang, state.weight_version = True, "v2"
    out = run(url, lambda c: c.generate(input_ids=[1], sampling_params={"max_new_tokens": 3}))
    assert not out.spans_known and out.weight_version == "v2"
    with pytest.raises(UnknownTokenVersionsError, match=r"no meta_info\.weight_versions"):
        out.token_versions()
    with pytest.raises(UnknownTokenVersionsError):
        out.token_versions(default="v2")  # the gateway's call: a default claims no more


def test_present_but_empty_spans_mean_no_change() -> None:
    out = GenerateOutput.from_json(
        {"output_ids": [1, 2], "meta_info": {"weight_version": "4", "weight_versions": []}}
    )
    assert out.spans_known and out.token_versions() == ["4", "4"]


@pytest.mark.parametrize("chunking", ["cumulative", "incremental"])
def test_a_stream_without_spans_takes_each_chunks_version(
    standin: tuple[StandIn, str], chunking: str
) -> None:
    state, url = standin
    state.old_sglang, state.chunking = True, chunking
    state.versions_by_chunk = ["v1", "v1", "v2", "v3", "v3"]
    chunks = run(url, lambda c: collect(c, input_ids=[1], sampling_params={"max_new_tokens": 5}))
    last = chunks[-1]
    assert last.spans_known and last.weight_version == "v3"
    assert last.weight_versions == [
        WeightVersionSpan("v1", 0, 2), WeightVersionSpan("v2", 2, 3), WeightVersionSpan("v3", 3, 5)
    ]  # fmt: skip
    assert last.token_versions() == ["v1", "v1", "v2", "v3", "v3"]
    assert chunks[2].token_versions() == ["v1", "v1", "v2"]


# --- streaming -------------------------------------------------------------------------------


@pytest.mark.parametrize("server_chunking", ["cumulative", "incremental"])
@pytest.mark.parametrize("send_counts", [True, False])
@pytest.mark.parametrize("client_chunking", ["auto", "explicit"])
def test_stream_reassembles_both_chunkings(
    standin: tuple[StandIn, str], server_chunking: str, send_counts: bool, client_chunking: str
) -> None:
    state, url = standin
    state.chunking, state.send_counts = server_chunking, send_counts
    chunking = "auto" if client_chunking == "auto" else server_chunking
    chunks = run(
        url,
        lambda c: collect(c, input_ids=[1, 2], sampling_params={"max_new_tokens": 4}, rid="s1"),
        stream_chunking=chunking,
    )
    assert state.log[-1][1]["stream"] is True
    assert [c.output_ids for c in chunks] == [
        [100],
        [100, 101],
        [100, 101, 102],
        [100, 101, 102, 103],
    ]
    assert [c.delta_output_ids for c in chunks] == [[100], [101], [102], [103]]
    assert [c.delta_text for c in chunks] == ["<100>", "<101>", "<102>", "<103>"]
    assert [c.delta_logprobs for c in chunks] == [[-0.5], [-1.0], [-1.5], [-2.0]]
    final = chunks[-1]
    assert final.text == "<100><101><102><103>"
    assert final.output_logprobs == [-0.5, -1.0, -1.5, -2.0]
    assert final.completion_tokens == 4 and final.finished
    assert final.finish_reason is not None and final.finish_reason.type == "length"
    assert not any(c.finished for c in chunks[:-1])


@pytest.mark.parametrize("chunking", ["cumulative", "incremental"])
def test_a_coalesced_stream_yields_what_one_read_brought_as_one_output(
    standin: tuple[StandIn, str], chunking: str
) -> None:
    state, url = standin
    state.chunking, state.one_write = chunking, True
    kwargs: dict[str, Any] = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4}}
    apart = run(url, lambda c: collect(c, **kwargs))
    together = run(url, lambda c: collect(c, **kwargs, coalesce=True))
    assert len(apart) == 4  # without coalescing: one output per chunk, however they came
    assert len(together) == 1
    (out,) = together
    assert out.delta_output_ids == [100, 101, 102, 103] == out.output_ids
    assert out.delta_logprobs == [-0.5, -1.0, -1.5, -2.0] == out.output_logprobs
    assert out.delta_text == "<100><101><102><103>" == out.text
    assert out.finished and out.completion_tokens == 4
    assert out.output_ids == apart[-1].output_ids and out.text == apart[-1].text


def test_a_coalesced_stream_without_spans_still_labels_each_token_by_its_chunk(
    standin: tuple[StandIn, str],
) -> None:
    """An SGLang without spans says only each chunk's version: chunks read together must still
    give each token its own chunk's version (training on a wrong one would be wrong)."""
    state, url = standin
    state.old_sglang, state.chunking, state.one_write = True, "incremental", True
    state.versions_by_chunk = ["v1", "v1", "v2", "v3", "v3"]
    kwargs: dict[str, Any] = {"input_ids": [1], "sampling_params": {"max_new_tokens": 5}}
    (out,) = run(url, lambda c: collect(c, **kwargs, coalesce=True))
    assert out.token_versions() == ["v1", "v1", "v2", "v3", "v3"]
    assert out.weight_versions == [
        WeightVersionSpan("v1", 0, 2), WeightVersionSpan("v2", 2, 3), WeightVersionSpan("v3", 3, 5)
    ]  # fmt: skip


def test_a_coalesced_stream_read_as_it_comes_yields_every_chunk(
    standin: tuple[StandIn, str],
) -> None:
    state, url = standin
    state.chunking, state.lockstep = "incremental", threading.Semaphore(0)
    kwargs: dict[str, Any] = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4}}

    async def read_as_it_comes(client: InferenceClient) -> list[GenerateOutput]:
        chunks = []
        async for chunk in client.generate_stream(**kwargs, coalesce=True):
            chunks.append(_snapshot(chunk))
            state.lockstep.release()  # type: ignore[union-attr]  # only now the next one
        return chunks

    chunks = run(url, read_as_it_comes)
    assert [c.delta_output_ids for c in chunks] == [[100], [101], [102], [103]]
    assert [c.delta_text for c in chunks] == ["<100>", "<101>", "<102>", "<103>"]


def test_stream_auto_survives_repeated_tokens_with_counts() -> None:
    """Incremental chunks that look like a cumulative prefix are told apart by completion_tokens."""
    asm = _StreamAssembler("auto")
    outs = [
        asm.add({"output_ids": [7], "meta_info": {"completion_tokens": 1}}).snapshot(),
        asm.add({"output_ids": [7], "meta_info": {"completion_tokens": 2}}).snapshot(),
        asm.add({"output_ids": [7, 7], "meta_info": {"completion_tokens": 4}}).snapshot(),
    ]
    assert [o.output_ids for o in outs] == [[7], [7, 7], [7, 7, 7, 7]]
    assert outs[-1].delta_output_ids == [7, 7]


def test_pause_abort_ends_a_running_stream(standin: tuple[StandIn, str]) -> None:
    state, url = standin
    state.lockstep = threading.Semaphore(0)

    async def scenario(client: InferenceClient) -> tuple[list[GenerateOutput], dict[str, Any]]:
        chunks: list[GenerateOutput] = []
        async for chunk in client.generate_stream(
            input_ids=[1], sampling_params={"max_new_tokens": 500}
        ):
            chunks.append(chunk)
            if len(chunks) == 3:
                answer = await client.pause_generation("abort")
            state.lockstep.release()  # type: ignore[union-attr]
        await client.continue_generation()
        return chunks, answer

    chunks, answer = run(url, scenario)
    assert answer["status"] == "ok"
    assert chunks[-1].aborted and chunks[-1].finish_reason is not None
    assert chunks[-1].finish_reason.message == "paused"
    assert 3 <= len(chunks[-1].output_ids) < 500
    assert [entry[0] for entry in state.log[-2:]] == ["pause", "continue"]
    assert state.log[-2][1] == {"mode": "abort"}
    assert not state.abort_event.is_set()


def test_error_chunk_in_stream_raises(standin: tuple[StandIn, str]) -> None:
    _, url = standin
    with pytest.raises(InferenceError, match="boom in the scheduler") as info:
        run(url, lambda c: collect(c, input_ids=[1], sampling_params={}, rid="error-mid-stream"))
    assert info.value.status_code == 400 and info.value.url.endswith("/generate")


def test_stream_http_error_raises_before_any_chunk(standin: tuple[StandIn, str]) -> None:
    _, url = standin
    with pytest.raises(InferenceError, match="input_ids is empty") as info:
        run(url, lambda c: collect(c, input_ids=[], sampling_params={}))
    assert info.value.status_code == 400


def test_stream_chunk_longer_than_the_read_buffer(standin: tuple[StandIn, str]) -> None:
    """One cumulative chunk of a long generation with log-probs is far over aiohttp's 128 KiB."""
    _, url = standin
    n = 8000
    chunks = run(
        url,
        lambda c: collect(c, input_ids=[1], sampling_params={"max_new_tokens": n}, rid="one-chunk"),
    )
    assert len(chunks) == 1 and chunks[0].finished
    assert chunks[0].output_ids == [100 + i for i in range(n)]
    assert chunks[0].output_logprobs[-1] == -0.5 * n and len(chunks[0].delta_logprobs) == n


def test_stream_cut_off_by_the_server_raises_without_status(standin: tuple[StandIn, str]) -> None:
    _, url = standin
    with pytest.raises(InferenceError) as info:
        run(url, lambda c: collect(c, input_ids=[1], sampling_params={}, rid="drop-mid-stream"))
    assert info.value.status_code is None and info.value.url == f"{url}/generate"


@pytest.mark.parametrize(
    "pieces",
    [
        [b"data: 1\n\ndata: 2\n\n"],
        [b"da", b"ta: 1\r", b"\n\r\ndata: 2", b"\r\n", b"\r\n"],
        [b"data: 1\r\rdata: 2"],
        [b"data: 1\n", b"\n", b"data", b": ", b"2"],
    ],
)
def test_sse_lines_across_chunk_boundaries(pieces: list[bytes]) -> None:
    async def split() -> list[str]:
        async def chunks() -> AsyncIterator[bytes]:
            for piece in pieces:
                yield piece

        return [line async for lines in _line_batches(chunks()) for line in lines]

    assert [line for line in asyncio.run(split()) if line] == ["data: 1", "data: 2"]


def test_sse_lines_keep_a_character_split_between_chunks() -> None:
    encoded = 'data: {"text": "héllo"}\n'.encode()
    cut = encoded.index("é".encode()) + 1  # inside the two bytes of é

    async def split() -> list[str]:
        async def chunks() -> AsyncIterator[bytes]:
            yield encoded[:cut]
            yield encoded[cut:]

        return [line async for lines in _line_batches(chunks()) for line in lines]

    assert asyncio.run(split()) == ['data: {"text": "héllo"}']


# --- errors ----------------------------------------------------------------------------------


def test_sglang_error_body_becomes_inference_error(standin: tuple[StandIn, str]) -> None:
    _, url = standin
    with pytest.raises(InferenceError) as info:
        run(url, lambda c: c.generate(input_ids=[], sampling_params={}))
    err = info.value
    assert err.status_code == 400 and err.message == "The input_ids is empty."
    assert err.err_type == "invalid_request_error" and err.retryable is False
    assert err.url == f"{url}/generate"
    assert url in str(err) and "HTTP 400" in str(err)


@pytest.mark.parametrize(
    ("status", "body", "media", "message"),
    [
        (503, '{"message": "server is starting"}', "application/json", "server is starting"),
        (422, '{"detail": "field required"}', "application/json", "field required"),
        (
            422,
            '{"detail": [{"loc": ["body", "mode"]}]}',
            "application/json",
            '[{"loc": ["body", "mode"]}]',
        ),
        (500, "Internal Server Error", "text/plain", "Internal Server Error"),
        (502, '{"error": "upstream gone"}', "application/json", "upstream gone"),
    ],
)
def test_other_error_bodies_are_tolerated(
    standin: tuple[StandIn, str], status: int, body: str, media: str, message: str
) -> None:
    state, url = standin
    state.fail_next = (status, body, media)
    with pytest.raises(InferenceError) as info:
        run(url, lambda c: c.pause_generation())
    assert (info.value.status_code, info.value.message) == (status, message)
    assert info.value.url == f"{url}/pause_generation"


def test_unreachable_server_raises_inference_error_without_status() -> None:
    url = f"http://127.0.0.1:{pick_free_port()}"
    with pytest.raises(InferenceError) as info:
        run(url, lambda c: c.generate(input_ids=[1], sampling_params={}), connect_timeout=2)
    assert info.value.status_code is None and info.value.url == f"{url}/generate"
    with pytest.raises(InferenceError) as info:
        run(url, lambda c: collect(c, input_ids=[1], sampling_params={}), connect_timeout=2)
    assert info.value.status_code is None and info.value.url == f"{url}/generate"


def test_a_slow_answer_times_out_without_status(standin: tuple[StandIn, str]) -> None:
    state, url = standin
    state.answering.clear()  # the stand-in holds its answers until the end of the test
    try:
        for scenario in (
            lambda c: c.generate(input_ids=[1], sampling_params={}),
            lambda c: collect(c, input_ids=[1], sampling_params={}),
        ):
            with pytest.raises(InferenceError, match="Timeout") as info:
                run(url, scenario, timeout=0.2)
            assert info.value.status_code is None and info.value.url == f"{url}/generate"
    finally:
        state.answering.set()


def test_timeout_bounds_each_wait_not_the_whole_stream(standin: tuple[StandIn, str]) -> None:
    """A stream that keeps producing outlives ``timeout``, as with httpx's read timeout (the
    wall-clock smoke test of the stand-in's ``token_delay``: chunks 0.1 s apart, 0.8 s in all)."""
    state, url = standin
    state.token_delay = 0.1
    started = time.monotonic()
    chunks = run(
        url, lambda c: collect(c, input_ids=[1], sampling_params={"max_new_tokens": 8}), timeout=0.5
    )
    assert time.monotonic() - started > 0.5
    assert chunks[-1].finished and len(chunks[-1].output_ids) == 8


def test_client_made_outside_a_loop_and_closed(standin: tuple[StandIn, str]) -> None:
    _, url = standin
    client = InferenceClient(url)  # no running loop here: the session comes on first use

    async def use() -> bool:
        healthy = await client.health()
        await client.aclose()
        await client.aclose()  # closing twice is harmless
        return healthy

    assert asyncio.run(use()) is True
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(client.model_info())


def test_api_key_is_sent_as_bearer_token(standin: tuple[StandIn, str]) -> None:
    state, url = standin
    state.api_key = "sk-test"
    with pytest.raises(InferenceError) as info:
        run(url, lambda c: c.model_info())
    assert info.value.status_code == 401
    assert run(url, lambda c: c.model_info(), api_key="sk-test")["model_path"] == "/models/tiny"


# --- info, health, control -------------------------------------------------------------------


def test_health_and_wait_healthy(standin: tuple[StandIn, str]) -> None:
    _, url = standin
    assert run(url, lambda c: c.health()) is True
    run(url, lambda c: c.wait_healthy(timeout=5))


def test_wait_healthy_names_the_url_on_timeout() -> None:
    url = f"http://127.0.0.1:{pick_free_port()}"
    assert run(url, lambda c: c.health()) is False
    with pytest.raises(TimeoutError, match=f"{url}/health"):
        run(url, lambda c: c.wait_healthy(timeout=0.5, interval=0.1))


def test_model_info_falls_back_to_the_old_alias(standin: tuple[StandIn, str]) -> None:
    state, url = standin
    assert run(url, lambda c: c.model_info())["is_generation"] is True
    assert state.log[-1] == ("model_info", "/model_info")
    state.has_model_info = False
    assert run(url, lambda c: c.model_info())["model_path"] == "/models/tiny"
    assert state.log[-1] == ("model_info", "/get_model_info")


def test_abort_request_bodies(standin: tuple[StandIn, str]) -> None:
    state, url = standin

    async def scenario(client: InferenceClient) -> None:
        await client.abort_request(rid="r-7")
        await client.abort_request(abort_all=True)
        with pytest.raises(ValueError, match="rid or abort_all"):
            await client.abort_request()

    run(url, scenario)
    assert [e for e in state.log if e[0] == "abort"] == [
        ("abort", {"rid": "r-7", "abort_all": False}),
        ("abort", {"rid": "", "abort_all": True}),
    ]


def test_pause_mode_is_checked(standin: tuple[StandIn, str]) -> None:
    _, url = standin
    with pytest.raises(ValueError, match="in_place"):
        run(url, lambda c: c.pause_generation("freeze"))  # type: ignore[arg-type]


def test_flush_cache_reports_refusal(standin: tuple[StandIn, str]) -> None:
    state, url = standin
    assert run(url, lambda c: c.flush_cache()) is True
    state.busy = True
    assert run(url, lambda c: c.flush_cache()) is False


def test_update_weights_from_disk(standin: tuple[StandIn, str]) -> None:
    state, url = standin

    async def scenario(client: InferenceClient) -> tuple[dict[str, Any], dict[str, Any]]:
        answer = await client.update_weights_from_disk("/ckpt/step-3", weight_version="3")
        out = await client.generate(input_ids=[1], sampling_params={"max_new_tokens": 2})
        return answer, {"version": out.weight_version, "versions": out.token_versions()}

    answer, seen = run(url, scenario)
    assert answer["success"] is True
    assert state.log[0] == (
        "update_weights_from_disk",
        {"model_path": "/ckpt/step-3", "abort_all_requests": False, "weight_version": "3"},
    )
    assert seen == {"version": "3", "versions": ["3", "3"]}
    with pytest.raises(InferenceError, match="no such dir") as info:
        run(url, lambda c: c.update_weights_from_disk("/no/such/dir"))
    assert info.value.status_code == 400


def test_update_weight_version(standin: tuple[StandIn, str]) -> None:
    state, url = standin
    answer = run(url, lambda c: c.update_weight_version("9"))
    assert answer["new_version"] == "9" and state.weight_version == "9"


def test_logprob_null_becomes_nan() -> None:
    out = GenerateOutput.from_json(
        {"output_ids": [5], "meta_info": {"output_token_logprobs": [[None, 5, None]]}}
    )
    assert math.isnan(out.output_logprobs[0])


@pytest.mark.parametrize("chunking", ["cumulative", "incremental", "auto"])
def test_stream_text_deltas_hold_back_a_partial_character(chunking: str) -> None:
    """SGLang's cumulative text may end in U+FFFD until the next token completes the character:
    the delta waits for it, so the deltas join to the final text."""
    asm = _StreamAssembler(chunking)  # type: ignore[arg-type]
    if chunking == "incremental":
        texts = ["a", "", "é", "b"]  # an incremental server sends only whole characters
    else:
        texts = ["a\ufffd", "a\ufffd", "aé", "aéb"]
    outs = []
    for i, text in enumerate(texts):
        meta = {"completion_tokens": i + 1, "finish_reason": {"type": "length"} if i == 3 else None}
        outs.append(asm.add({"text": text, "output_ids": [i] if chunking == "incremental" else list(range(i + 1)), "meta_info": meta}))  # fmt: skip
    assert [o.delta_text for o in outs] == ["a", "", "é", "b"]
    assert "".join(o.delta_text for o in outs) == outs[-1].text == "aéb"
    assert outs[-1].output_ids == [0, 1, 2, 3]


def test_stream_outputs_share_the_growing_lists() -> None:
    """No per-chunk copy of the lists: every output is a view of the stream so far (snapshot()
    keeps one as it was), which is what makes a long stream linear."""
    asm = _StreamAssembler("incremental")
    outs = []
    for i in range(2000):
        meta = {"completion_tokens": i + 1, "output_token_logprobs": [[-0.5, i, None]]}
        outs.append(asm.add({"text": "x", "output_ids": [i], "meta_info": meta}))
    assert all(o.output_ids is outs[-1].output_ids for o in outs)
    assert outs[9].text == "x" * 10 and outs[-1].text == "x" * 2000  # joined as of its chunk
    assert outs[-1].output_logprobs == [-0.5] * 2000
    assert outs[0].snapshot().output_ids == list(range(2000))  # a snapshot taken late is late
