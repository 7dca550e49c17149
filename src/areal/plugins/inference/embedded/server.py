"""The embedded engine's HTTP server: the SGLang native API subset of docs/inference.md.

Handlers (aiohttp) validate, tokenize and hand sequences to the engine thread; results come back
through ``loop.call_soon_threadsafe`` into one asyncio queue per HTTP request. Any bad input gets a 4xx in
SGLang's error shape; nothing a client sends can stop the server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
import torch
from aiohttp import web
from aiohttp.web import Request, Response
from pydantic import ValidationError

from areal.core.serve_hooks import ServeHooks
from areal.host.heap import keep_freed_memory
from areal.host.http_server import ServerThread
from areal.plugins.inference.embedded.engine import Engine, EngineConfig
from areal.plugins.inference.embedded.grammar import GRAMMAR_PARAMS, GrammarCompiler, GrammarError
from areal.plugins.inference.embedded.kv_pool import bytes_per_token
from areal.plugins.inference.embedded.requests import (
    RequestError,
    SequenceRequest,
    expand_generate,
)
from areal.plugins.inference.embedded.schema import (
    AbortRequest,
    DestroyWeightsUpdateGroupRequest,
    GenerateRequest,
    InitWeightsUpdateGroupRequest,
    PauseRequest,
    UpdateWeightsFromDiskRequest,
    UpdateWeightsFromDistributedRequest,
    UpdateWeightVersionRequest,
    describe_validation_error,
)
from areal.plugins.inference.embedded.weight_group import WeightUpdateGroups
from areal.plugins.models.hf_io import check_weights, load_model, read_weights, to_native

log = logging.getLogger("areal.inference")

DEFAULT_MEM_FRACTION = 0.05


def _error_body(status: int, message: str, err_type: str) -> dict[str, Any]:
    return {
        "error": {"message": message, "type": err_type, "code": status, "retryable": status >= 500}
    }


def error_response(status: int, message: str, err_type: str = "invalid_request_error") -> Response:
    return web.json_response(_error_body(status, message, err_type), status=status)


def _not_json(name: str) -> Any:
    """Python's json reads NaN and Infinity, which JSON does not have: refuse them."""
    raise RequestError(f"the body is not valid JSON: {name} is not a JSON value")


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw, parse_constant=_not_json)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RequestError(f"the body is not valid JSON: {err}") from None
    except RecursionError:  # json's parser recurses once per level of nesting
        raise RequestError("the body's JSON is nested too deeply") from None
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    return body


def _has_grammar(params: Any) -> bool:
    return any(getattr(params, key) is not None for key in GRAMMAR_PARAMS)


def _validate(model: type[Any], body: dict[str, Any]) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as err:
        raise RequestError(describe_validation_error(err)) from None


class InferenceServer:
    """Holds the engine, the tokenizer and the model description; builds the aiohttp app."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any | None,
        model_path: str,
        served_model_name: str | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_path = model_path
        self.served_model_name = served_model_name or model_path
        self.vocab_size = engine.model.config.vocab_size
        self.weight_groups = WeightUpdateGroups()
        self.ready = threading.Event()

    # --- helpers ----------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise RequestError("this server has no tokenizer: send input_ids instead of text")
        ids: list[int] = self.tokenizer.encode(text)
        return ids

    async def on_engine(self, fn: Any) -> Any:
        return await asyncio.wrap_future(self.engine.call(fn))

    def model_info(self) -> dict[str, Any]:
        cfg = self.engine.model.config
        return {
            "model_path": self.model_path,
            "served_model_name": self.served_model_name,
            "tokenizer_path": self.model_path if self.tokenizer is not None else None,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.engine.weight_version,
            "load_format": "safetensors",
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": cfg.model_type,
            "architectures": cfg.to_hf_dict()["architectures"],
            "max_total_num_tokens": self.engine.pool.capacity,
            "context_length": self.engine.max_context,
        }

    # --- routes -----------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        ok = self.ready.is_set() and self.engine.alive
        return Response(status=200 if ok else 503)

    async def get_model_info(self, request: Request) -> Response:
        return web.json_response(self.model_info())

    async def server_info(self, request: Request) -> Response:
        stats = await self.on_engine(self.engine.stats)
        return web.json_response({**self.model_info(), **stats, "version": _areal_version()})

    async def generate(self, request: Request) -> web.StreamResponse:
        req = _validate(GenerateRequest, await _json_body(request))
        seqs, as_list = expand_generate(req, self.encode, self.vocab_size)
        if any(_has_grammar(seq.params) for seq in seqs):
            # compiling a new grammar can take a while: keep it off the event loop
            await asyncio.to_thread(self._validate_all, seqs)
        else:
            for seq in seqs:
                self.engine.validate(seq)
        loop = asyncio.get_running_loop()
        results: asyncio.Queue[tuple[int, dict[str, Any], bool]] = asyncio.Queue()

        def emitter(i: int) -> Callable[[dict[str, Any], bool], None]:
            def emit(payload: dict[str, Any], final: bool) -> None:
                loop.call_soon_threadsafe(results.put_nowait, (i, payload, final))

            return emit

        for i, seq in enumerate(seqs):
            self.engine.submit(seq, emitter(i))
        rids = [s.rid for s in seqs]
        if req.stream:
            return await self._stream(request, results, len(seqs), as_list, rids)
        outputs: list[dict[str, Any] | None] = [None] * len(seqs)
        try:
            remaining = len(seqs)
            while remaining:
                i, payload, final = await results.get()
                if final:
                    outputs[i] = payload
                    remaining -= 1
        except asyncio.CancelledError:
            self._abort_rids(rids)
            raise
        return web.json_response(outputs if as_list else outputs[0])

    def _validate_all(self, seqs: list[SequenceRequest]) -> None:
        for seq in seqs:
            self.engine.validate(seq)

    async def _stream(
        self,
        request: Request,
        results: asyncio.Queue[tuple[int, dict[str, Any], bool]],
        count: int,
        indexed: bool,
        rids: list[str],
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        remaining = count
        try:
            while remaining:
                i, payload, final = await results.get()
                if indexed:
                    payload["index"] = i
                remaining -= final
                await response.write(f"data: {json.dumps(payload)}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
        finally:
            if remaining:  # the client went away: stop spending compute on it
                self._abort_rids(rids)
        return response

    def _abort_rids(self, rids: list[str]) -> None:
        def abort() -> None:
            for rid in rids:
                self.engine.abort(rid, "client disconnected")

        self.engine.call(abort)

    async def update_weights_from_disk(self, request: Request) -> Response:
        req = _validate(UpdateWeightsFromDiskRequest, await _json_body(request))
        try:
            tensors = await asyncio.to_thread(read_weights, self.engine.model, req.model_path)
        except (OSError, ValueError) as err:
            return _failed(str(err))
        return await self._apply_weights(
            tensors, req.weight_version, req.abort_all_requests, req.model_path
        )

    async def init_weights_update_group(self, request: Request) -> Response:
        req = _validate(InitWeightsUpdateGroupRequest, await _json_body(request))
        try:
            await asyncio.to_thread(lambda: self.weight_groups.init_group(**req.model_dump()))
        except RequestError:
            raise
        except (RuntimeError, ValueError) as err:  # the store or the peers could not be reached
            return _failed(f"could not join weight update group {req.group_name!r}: {err}")
        return web.json_response(
            {"success": True, "message": f"joined {req.group_name!r} as rank {req.rank_offset}"}
        )

    async def update_weights_from_distributed(self, request: Request) -> Response:
        req = _validate(UpdateWeightsFromDistributedRequest, await _json_body(request))

        def receive() -> dict[str, torch.Tensor]:
            received = self.weight_groups.receive(
                group_name=req.group_name,
                names=req.names,
                dtypes=req.dtypes,
                shapes=req.shapes,
                flattened=req.load_format == "flattened_bucket",
            )
            dtype = next(self.engine.model.parameters()).dtype
            native = {k: v.to(dtype) for k, v in to_native(iter(received.items())).items()}
            return check_weights(self.engine.model, native, source="broadcast", complete=False)

        try:
            tensors = await asyncio.to_thread(receive)
        except RequestError:
            raise
        except (RuntimeError, ValueError) as err:
            return _failed(str(err))
        return await self._apply_weights(
            tensors, req.weight_version, req.abort_all_requests, "broadcast"
        )

    async def destroy_weights_update_group(self, request: Request) -> Response:
        req = _validate(DestroyWeightsUpdateGroupRequest, await _json_body(request))
        self.weight_groups.destroy(req.group_name)
        return web.json_response({"success": True, "message": f"left {req.group_name!r}"})

    async def _apply_weights(
        self, tensors: dict[str, torch.Tensor], version: str | None, abort_all: bool, source: str
    ) -> Response:
        def apply() -> str:
            if abort_all:
                self.engine.abort_all("aborted for a weight update")
            return self.engine.load_weights(tensors, version)

        new_version = await self.on_engine(apply)
        log.info("loaded weights from %s as version %s", source, new_version)
        return web.json_response(
            {
                "success": True,
                "message": f"Succeeded to update model weights (version {new_version}).",
                "num_paused_requests": 0,
                "weight_version": new_version,
            }
        )

    async def pause_generation(self, request: Request) -> Response:
        req = _validate(PauseRequest, await _json_body(request))
        await self.on_engine(lambda: self.engine.pause(req.mode))
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: Request) -> Response:
        await _json_body(request)  # accepts SGLang's {"torch_empty_cache": ...}
        await self.on_engine(self.engine.resume)
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def abort_request(self, request: Request) -> Response:
        req = _validate(AbortRequest, await _json_body(request))
        message = req.abort_message or "aborted by request"
        if req.abort_all:
            await self.on_engine(lambda: self.engine.abort_all(message))
        elif req.rid:
            await self.on_engine(lambda: self.engine.abort(req.rid, message))
        else:
            raise RequestError("give a rid or abort_all: true")
        return Response(status=200)

    async def flush_cache(self, request: Request) -> Response:
        busy = await self.on_engine(lambda: bool(self.engine.running))
        if busy:
            return error_response(400, "Cache not flushed: requests are running.")
        return Response(text="Cache flushed.")

    async def update_weight_version(self, request: Request) -> Response:
        req = _validate(UpdateWeightVersionRequest, await _json_body(request))

        def apply() -> None:
            if req.abort_all_requests:
                self.engine.abort_all("aborted for a weight version change")
            self.engine.weight_version = req.new_version

        await self.on_engine(apply)
        return web.json_response({"success": True, "message": "ok", "new_version": req.new_version})

    def http(self, host: str = "127.0.0.1", port: int = 0) -> ServerThread:
        """The app on a server thread (not started). A client that goes away cancels its
        handler, which aborts its generations (as SGLang and vLLM do): a gateway that gives up
        on a call must not leave the engine decoding for nobody."""
        return ServerThread(self.app(), host, port, handler_cancellation=True)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_errors], client_max_size=64 * 1024**2)
        routes: list[tuple[str, str, Callable[[Request], Awaitable[web.StreamResponse]]]] = [
            ("GET", "/health", self.health),
            ("GET", "/model_info", self.get_model_info),
            ("GET", "/get_model_info", self.get_model_info),
            ("GET", "/server_info", self.server_info),
            ("GET", "/get_server_info", self.server_info),
            ("POST", "/generate", self.generate),
            ("PUT", "/generate", self.generate),
            ("POST", "/update_weights_from_disk", self.update_weights_from_disk),
            ("POST", "/init_weights_update_group", self.init_weights_update_group),
            ("POST", "/update_weights_from_distributed", self.update_weights_from_distributed),
            ("POST", "/destroy_weights_update_group", self.destroy_weights_update_group),
            ("POST", "/pause_generation", self.pause_generation),
            ("POST", "/continue_generation", self.continue_generation),
            ("POST", "/abort_request", self.abort_request),
            ("GET", "/flush_cache", self.flush_cache),
            ("POST", "/flush_cache", self.flush_cache),
            ("POST", "/update_weight_version", self.update_weight_version),
        ]
        for method, path, handler in routes:
            app.router.add_route(method, path, handler)
        return app


@web.middleware
async def _errors(
    request: Request, handler: Callable[[Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every failure leaves in SGLang's error shape; nothing a client sends escapes as a crash."""
    try:
        return await handler(request)
    except (RequestError, GrammarError) as exc:
        return error_response(getattr(exc, "status_code", 400), str(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.status, f"{request.method} {request.path}: {exc.reason}")
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:
        log.exception("unhandled error on %s", request.path)
        return error_response(500, f"internal error: {exc}", "internal_error")


def _failed(message: str) -> Response:
    """SGLang's answer to a weight update that did not happen: 400 with success false, and the
    error object every other 4xx carries, so one reader handles every refusal."""
    body = {
        "success": False,
        "message": message,
        "num_paused_requests": 0,
        **_error_body(400, message, "invalid_request_error"),
    }
    return web.json_response(body, status=400)


def _areal_version() -> str:
    from areal import __version__

    return __version__


def kv_budget_tokens(
    model: Any,
    max_total_tokens: int | None,
    mem_fraction_static: float | None,
    max_running_requests: int,
) -> int:
    """Tokens of KV cache: given directly, or a fraction of this machine's memory minus weights."""
    if max_total_tokens is not None:
        return max_total_tokens
    fraction = DEFAULT_MEM_FRACTION if mem_fraction_static is None else mem_fraction_static
    if not 0 < fraction < 1:
        raise ValueError(f"--mem-fraction-static must be in (0, 1), got {fraction}")
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    budget = psutil.virtual_memory().total * fraction - weights
    per_token = bytes_per_token(model.config, next(model.parameters()).dtype)
    tokens = int(budget // per_token)
    if tokens <= 0:
        raise ValueError(f"--mem-fraction-static {fraction} leaves no memory for the KV cache")
    return min(tokens, max_running_requests * model.config.max_position_embeddings)


def build_server(
    model_path: str,
    *,
    max_total_tokens: int | None = None,
    mem_fraction_static: float | None = None,
    max_running_requests: int = 64,
    weight_version: str | None = None,
    seed: int = 0,
    served_model_name: str | None = None,
    start_engine: bool = True,
    incremental_streaming_output: bool = True,
    compile_decode: bool = False,
    pack_weights: bool | None = None,
    decode_kernel: bool | None = None,
) -> InferenceServer:
    """Load the model and tokenizer; start the engine on a background thread unless told not to
    (``serve`` runs it on the main thread). The HTTP app is not bound here."""
    model = load_model(model_path)
    tokenizer = _load_tokenizer(model_path)
    eos = set(model.config.eos_token_ids)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    generation = Path(model_path, "generation_config.json")
    if generation.is_file():
        gen_eos = json.loads(generation.read_text()).get("eos_token_id")
        eos.update([gen_eos] if isinstance(gen_eos, int) else gen_eos or [])
    config = EngineConfig(
        max_total_tokens=kv_budget_tokens(
            model, max_total_tokens, mem_fraction_static, max_running_requests
        ),
        max_running_requests=max_running_requests,
        weight_version=weight_version or "0",
        seed=seed,
        incremental_streaming_output=incremental_streaming_output,
        compile_decode=compile_decode,
        pack_weights=pack_weights,
        decode_kernel=decode_kernel,
    )
    # Compact JSON (no free whitespace between tokens): an untrained policy under a schema would
    # otherwise spend its whole budget on newlines, and a forced tool call must always finish.
    grammar = (
        GrammarCompiler(tokenizer, model.config.vocab_size, sorted(eos), json_any_whitespace=False)
        if tokenizer
        else None
    )

    def decode(ids: list[int], skip_special: bool) -> str:
        if tokenizer is None:
            return ""
        text: str = tokenizer.decode(ids, skip_special_tokens=skip_special)
        return text

    engine = Engine(model, decode, sorted(eos), config, grammar)
    if start_engine:
        engine.start()
    server = InferenceServer(engine, tokenizer, model_path, served_model_name)
    server.ready.set()
    log.info(
        "engine ready: %s, KV cache %d tokens (%.1f MiB), version %s",
        model_path,
        engine.pool.capacity,
        engine.pool.nbytes() / 2**20,
        engine.weight_version,
    )
    return server


def _load_tokenizer(model_path: str) -> Any | None:
    if (
        not Path(model_path, "tokenizer.json").is_file()
        and not Path(model_path, "tokenizer_config.json").is_file()
    ):
        log.warning("no tokenizer in %s: only input_ids requests will work", model_path)
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def serve(
    model_path: str,
    host: str = "127.0.0.1",
    port: int = 30000,
    max_total_tokens: int | None = None,
    mem_fraction_static: float | None = None,
    max_running_requests: int = 64,
    weight_version: str | None = None,
    seed: int = 0,
    log_level: str = "info",
    served_model_name: str | None = None,
    hooks: ServeHooks | None = None,
    incremental_streaming_output: bool = True,
    compile_decode: bool = False,
    pack_weights: bool | None = None,
    decode_kernel: bool | None = None,
) -> None:
    """``areal serve inference``: load, serve HTTP on a side thread, run the engine on this one
    (see :mod:`~areal.plugins.inference.embedded.engine` for why the engine wants the main thread).
    ``hooks`` hear when it serves and when a signal asks it to stop (``--attach``).
    """
    import signal

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    keep_freed_memory()
    server = build_server(
        model_path,
        max_total_tokens=max_total_tokens,
        mem_fraction_static=mem_fraction_static,
        max_running_requests=max_running_requests,
        weight_version=weight_version,
        seed=seed,
        served_model_name=served_model_name,
        start_engine=False,
        incremental_streaming_output=incremental_streaming_output,
        compile_decode=compile_decode,
        pack_weights=pack_weights,
        decode_kernel=decode_kernel,
    )
    http = server.http(host, port)
    try:
        http.start()
    except OSError as err:
        raise SystemExit(
            f"error: the HTTP server could not start on {host}:{port}: {err}"
        ) from None

    def stop() -> None:
        server.engine.stop()  # aborts what runs, so every open request gets its answer

    def on_signal(signum: int, frame: Any) -> None:
        if hooks is None:
            stop()
        else:
            hooks.signalled()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("serving on http://%s:%d", host, http.port)
    if hooks is not None:
        hooks.serving(f"http://{host}:{http.port}", stop)
    server.engine.run_forever()
    http.stop()
