"""The embedded engine: continuous batching over a fixed KV budget, on one dedicated thread.

Requests join the running batch as soon as the budget holds their prompt plus ``max_new_tokens``
(so nothing is ever evicted mid-flight); a finished sequence leaves at once and frees its slots.
Each loop turn runs one prefill batch (new sequences) and one decode batch (one token for every
running sequence). Control calls (pause, abort, weight updates) run on the engine thread between
steps, so the model is never touched by two threads at once.

``areal serve inference`` runs the loop on the process's main thread and the HTTP server beside it:
on CPU, torch's OpenMP/MKL kernels called from a secondary thread ran small GEMMs ~2.5x slower
(measured: 69 us vs 184 us for [16, 256] x [256, 768] with 2 threads), which halved throughput.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from areal.plugins.inference.embedded import decode_kernel
from areal.plugins.inference.embedded.grammar import (
    GrammarCompiler,
    grammar_spec_from_sampling_params,
)
from areal.plugins.inference.embedded.kv_pool import TokenKVPool
from areal.plugins.inference.embedded.packed_linear import (
    PackedWeights,
    can_pack,
    measure_packing,
)
from areal.plugins.inference.embedded.paged_attention import build_packed_step, build_step
from areal.plugins.inference.embedded.requests import Emit, RequestError, SequenceRequest
from areal.plugins.inference.embedded.sampling import (
    SamplingTensors,
    final_logprobs,
    reported_logprobs,
    sample,
)
from areal.plugins.inference.embedded.sequence import Sequence
from areal.plugins.inference.embedded.streaming import TextChunker
from areal.plugins.models.decoder import DecoderForCausalLM
from areal.plugins.models.hf_io import copy_weights

if TYPE_CHECKING:
    from areal.plugins.inference.embedded.compiled_decode import CompiledDecode

log = logging.getLogger("areal.inference")


@dataclass
class EngineConfig:
    max_total_tokens: int
    max_running_requests: int = 64
    max_prefill_tokens: int = 4096  # new tokens per prefill batch (packed: no padding)
    weight_version: str = "0"
    seed: int = 0
    # stream only what each step adds (SGLang's --incremental-streaming-output); False: the
    # whole output so far in every chunk, as SGLang streams by default
    incremental_streaming_output: bool = True
    # compile the decode step (compiled_decode.py): faster steps, tens of seconds at start
    compile_decode: bool = False
    # linear layers on oneDNN-packed copies of their weights (packed_linear.py), re-packed after
    # every weight update; False: torch's own linear on the parameters; None: whichever this
    # CPU runs faster, measured at start-up (packed_linear.measure_packing)
    pack_weights: bool | None = None
    # the decode step's attention in the C++ kernel (decode_kernel.py): None: when it builds and
    # the KV pool is float32, else ATen's; True: the kernel or an error; False: ATen's
    decode_kernel: bool | None = None


class Engine:
    def __init__(
        self,
        model: DecoderForCausalLM,
        decode: Callable[[list[int], bool], str],
        eos_token_ids: list[int],
        config: EngineConfig,
        grammar: GrammarCompiler | None = None,
    ) -> None:
        self.model = model.eval()
        self.decode = decode
        self.eos_token_ids = frozenset(eos_token_ids)
        self.config = config
        self.grammar = grammar
        self.pool = TokenKVPool(
            model.config, config.max_total_tokens, next(model.parameters()).dtype
        )
        self.weight_version = config.weight_version
        self.max_context = model.config.max_position_embeddings
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.paused = False
        self.tokens_generated = 0
        self.peak_running = 0  # most sequences admitted at once (tests, /server_info)
        # phase -> [steps, seconds, sequences, tokens]: where the engine's time goes (/server_info)
        self.timings: dict[str, list[float]] = {
            "prefill": [0, 0.0, 0, 0],
            "decode": [0, 0.0, 0, 0],
        }
        # SimpleQueue: put() is reentrant, so a signal handler on the engine's thread may call stop()
        self._inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._alive = threading.Event()
        self._masker = grammar.new_masker() if grammar is not None else None
        self._prepacked: PackedWeights | None = None
        self.packing: dict[str, Any] = {"packed": False, "chosen_by": "config"}
        if config.pack_weights is not False and can_pack(self.model):
            if config.pack_weights is None:
                measured = measure_packing(self.model)
                self.packing = {**measured.to_json(), "chosen_by": "measured"}
                log.info(
                    "linear layers: %s (a decode step's, measured: packed %.2f ms, plain %.2f ms)",
                    "packed for oneDNN" if measured.pays else "torch's own",
                    measured.packed_ms,
                    measured.plain_ms,
                )
            if config.pack_weights or self.packing["packed"]:
                self._prepacked = PackedWeights(self.model)
                self.packing["packed"] = True
        self.decode_attention = _decode_attention(config.decode_kernel, self.pool.k[0].dtype)
        self._kernel = bool(self.decode_attention["kernel"])
        if self._kernel and not config.compile_decode:
            # The same build's one-call RMSNorm; a compiled step fuses the norms itself (and an
            # instance-level forward makes the compiled step slower: 6.4 ms against 6.0, measured).
            decode_kernel.use_kernel_norms(self.model)
        # An eager decode step's layers in one C++ call (a dense model's; decode_kernel.py).
        self._layer_loop = (
            decode_kernel.LayerLoop.of(self.model)
            if self._kernel and not config.compile_decode
            else None
        )
        self.decode_attention["layers_in_one_call"] = self._layer_loop is not None
        self._compiled: CompiledDecode | None = None
        if config.compile_decode:
            # Imported only when asked: it registers a torch op and pulls in the compiler stack,
            # start-up work an eager engine does not need.
            from areal.plugins.inference.embedded.compiled_decode import CompiledDecode

            self._compiled = CompiledDecode(self.model, self.pool, kernel=self._kernel)
            self._compiled.warm_up()
        torch.manual_seed(config.seed)

    # --- thread-safe API --------------------------------------------------------------------

    def start(self) -> None:
        """Run the loop on a background thread (tests, embedding in another process)."""
        self._thread = threading.Thread(target=self.run_forever, name="areal-engine", daemon=True)
        self._thread.start()
        self._alive.wait(timeout=10)

    def run_forever(self) -> None:
        """Run the loop on the calling thread until :meth:`stop`."""
        self._alive.set()
        try:
            self._loop()
        finally:
            self._alive.clear()

    @property
    def alive(self) -> bool:
        return self._alive.is_set()

    def stop(self, message: str = "the server is shutting down") -> None:
        """Finish every sequence as aborted (their callers get an answer), then end the loop."""

        def shutdown() -> None:
            self.abort_all(message)

        self._inbox.put(shutdown)
        self._inbox.put(self._stopped.set)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def validate(self, req: SequenceRequest) -> None:
        """Refuse what could never run: called by the HTTP layer before :meth:`submit`."""
        need = len(req.input_ids) + req.params.max_new_tokens
        if need > self.max_context:
            raise RequestError(
                f"prompt ({len(req.input_ids)} tokens) + max_new_tokens "
                f"({req.params.max_new_tokens}) exceeds the model's context of {self.max_context}"
            )
        if need > self.pool.capacity:
            raise RequestError(
                f"prompt + max_new_tokens ({need}) exceeds the KV cache budget of "
                f"{self.pool.capacity} tokens (raise --max-total-tokens)"
            )
        spec = grammar_spec_from_sampling_params(req.params.model_dump())
        if spec is not None:
            if self.grammar is None:
                raise RequestError("constrained decoding is not available (no tokenizer loaded)")
            self.grammar.compile(spec)  # GrammarError (a ValueError) -> 400 before queuing

    def submit(self, req: SequenceRequest, emit: Emit) -> None:
        self._inbox.put(lambda: self._enqueue(req, emit))

    def call(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run ``fn`` on the engine thread between steps; the future carries its result. A call
        cancelled before its turn (its HTTP client went away) is skipped: nobody waits for it."""
        fut: Future[Any] = Future()

        def run() -> None:
            if not fut.set_running_or_notify_cancel():
                return
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the caller, never kills the loop
                fut.set_exception(exc)

        self._inbox.put(run)
        return fut

    # --- control (run on the engine thread through call()) ----------------------------------

    def pause(self, mode: str) -> None:
        self.paused = True
        if mode == "abort":
            self.abort_all("paused for a weight update")
        elif mode == "retract":
            for seq in reversed(self.running):
                self._release(seq)
                seq.kv_len = 0
                self.waiting.appendleft(seq)
            self.running.clear()

    def resume(self) -> None:
        self.paused = False

    def abort(self, rid: str, message: str = "aborted by request") -> int:
        hits = [s for s in (*self.running, *self.waiting) if rid in (s.req.rid, s.req.group)]
        for seq in hits:
            self._finish(
                seq, {"type": "abort", "message": message, "status_code": None, "err_type": None}
            )
        return len(hits)

    def abort_all(self, message: str = "aborted by request") -> int:
        seqs = [*self.running, *self.waiting]
        for seq in seqs:
            self._finish(
                seq, {"type": "abort", "message": message, "status_code": None, "err_type": None}
            )
        return len(seqs)

    def load_weights(self, tensors: dict[str, torch.Tensor], version: str | None) -> str:
        """Copy new weights in place between steps; running sequences continue on them."""
        copy_weights(self.model, tensors)
        self.weight_version = version if version is not None else _next_version(self.weight_version)
        return self.weight_version

    def stats(self) -> dict[str, Any]:
        return {
            "running": len(self.running),
            "waiting": len(self.waiting),
            "paused": self.paused,
            "kv_capacity_tokens": self.pool.capacity,
            "kv_used_tokens": self.pool.used_tokens,
            "kv_peak_used_tokens": self.pool.peak_used,
            "kv_cache_bytes": self.pool.nbytes(),
            "tokens_generated": self.tokens_generated,
            "peak_running": self.peak_running,
            **{
                f"{phase}_{key}": value
                for phase, (steps, seconds, seqs, tokens) in self.timings.items()
                for key, value in (
                    ("steps", int(steps)),
                    ("ms_per_step", round(1000 * seconds / steps, 3) if steps else None),
                    ("mean_batch", round(seqs / steps, 2) if steps else None),
                    ("tokens", int(tokens)),
                    ("seconds", round(seconds, 3)),
                )
            },
            "weight_version": self.weight_version,
            "linear_weights": self.packing,
            "decode_attention": self.decode_attention,
        }

    # --- the loop ---------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopped.is_set():
            busy = bool(self.running) and not self.paused
            self._drain(block=not busy and not self._admissible())
            if self._stopped.is_set():
                break
            if self.paused:
                continue
            self._admit()
            prefill = [s for s in self.running if len(s.pending) > 1 or s.kv_len == 0]
            if prefill:
                self._timed("prefill", self._prefill_batch(prefill))
            decode = [s for s in self.running if s.kv_len > 0 and len(s.pending) == 1]
            if decode:
                self._timed("decode", decode)

    def _timed(self, phase: str, seqs: list[Sequence]) -> None:
        start = time.perf_counter()
        tokens = sum(len(s.pending) for s in seqs)
        self._run(seqs, packed=phase == "prefill")
        timing = self.timings[phase]
        timing[0] += 1
        timing[1] += time.perf_counter() - start
        timing[2] += len(seqs)
        timing[3] += tokens

    def _drain(self, block: bool) -> None:
        try:
            job = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        job()
        while True:
            try:
                job = self._inbox.get_nowait()
            except queue.Empty:
                return
            job()

    def _admissible(self) -> bool:
        return (
            bool(self.waiting)
            and not self.paused
            and len(self.running) < self.config.max_running_requests
        )

    def _enqueue(self, req: SequenceRequest, emit: Emit) -> None:
        params = req.params
        stop_ids = set(params.stop_token_ids or ())
        if not params.ignore_eos:
            stop_ids |= self.eos_token_ids
        seq = Sequence(
            req=req,
            emit=emit,
            full_ids=list(req.input_ids),
            prompt_len=len(req.input_ids),
            stop_ids=frozenset(stop_ids),
        )
        try:
            if params.sampling_seed is not None:
                seq.generator = torch.Generator().manual_seed(params.sampling_seed)
            spec = grammar_spec_from_sampling_params(params.model_dump())
            if spec is not None and self.grammar is not None:
                seq.matcher = self.grammar.new_matcher(spec)
        except Exception as exc:  # on the engine's thread: this request fails, the loop goes on
            log.exception("could not queue request %s", req.rid)
            self._finish(
                seq,
                {
                    "type": "abort",
                    "message": f"internal error: {exc}",
                    "status_code": 500,
                    "err_type": "InternalError",
                },
            )
            return
        if req.stream and self.config.incremental_streaming_output:
            skip = params.skip_special_tokens
            seq.chunker = TextChunker(lambda ids: self.decode(ids, skip), params.stop or [])
        self.waiting.append(seq)

    def _admit(self) -> None:
        while self._admissible():
            seq = self.waiting[0]
            slots = self.pool.alloc(seq.reserve)
            if slots is None:
                return  # first come, first served: wait for memory rather than skip ahead
            self.waiting.popleft()
            seq.slots = slots
            self.running.append(seq)
            self.peak_running = max(self.peak_running, len(self.running))

    def _prefill_batch(self, candidates: list[Sequence]) -> list[Sequence]:
        batch: list[Sequence] = []
        total = 0
        for seq in candidates:
            total += len(seq.pending)
            if batch and total > self.config.max_prefill_tokens:
                break
            batch.append(seq)
        # equal-length fresh prompts side by side: the packed step attends over them in one call
        return sorted(batch, key=lambda s: (s.kv_len > 0, len(s.pending)))

    def _run(self, seqs: list[Sequence], packed: bool) -> None:
        try:
            with torch.inference_mode():
                if self._prepacked is not None:
                    self._prepacked.refresh()  # weights written since the last step: re-pack them
                logits = self._forward(seqs, packed)
                self._advance(seqs, logits)
        except Exception as exc:  # a bad batch must not take the server down
            log.exception("engine step failed")
            for seq in seqs:
                if seq.finish is None:
                    self._finish(
                        seq,
                        {
                            "type": "abort",
                            "message": f"internal error: {exc}",
                            "status_code": 500,
                            "err_type": "InternalError",
                        },
                    )

    def _forward(self, seqs: list[Sequence], packed: bool) -> torch.Tensor:
        """Logits of each sequence's last new token; prefill runs packed, decode padded."""
        pending = [s.pending for s in seqs]
        slots = [s.slots for s in seqs if s.slots is not None]
        kv_lens = [s.kv_len for s in seqs]
        if packed:
            logits = self._prefill_logits(seqs, slots, kv_lens, pending)
        else:
            logits = self._decode_logits(slots, kv_lens, pending)
        for seq, tokens in zip(seqs, pending):
            seq.kv_len += len(tokens)
        return logits

    def _prefill_logits(
        self,
        seqs: list[Sequence],
        slots: list[torch.Tensor],
        kv_lens: list[int],
        pending: list[list[int]],
    ) -> torch.Tensor:
        ids, positions, attention, spans = build_packed_step(self.pool, slots, kv_lens, pending)
        hidden = self.model.hidden_states(ids, positions, attention)[0]
        for seq, span in zip(seqs, spans):
            first_prefill = seq.kv_len == 0 and seq.input_logprobs is None  # not after a retract
            if first_prefill and seq.req.return_logprob and seq.req.logprob_start_len >= 0:
                seq.input_logprobs = self._prompt_logprobs(seq, hidden[slice(*span)])
        last_hidden = hidden[torch.tensor([end - 1 for _, end in spans])]
        return self.model.lm_head(last_hidden).float()

    def _decode_logits(
        self, slots: list[torch.Tensor], kv_lens: list[int], pending: list[list[int]]
    ) -> torch.Tensor:
        ids, positions, attention = build_step(
            self.pool, slots, kv_lens, pending, kernel=self._kernel
        )
        if self._compiled is not None and self._compiled.fits(ids, attention):
            return self._compiled(ids, positions, attention)
        if self._layer_loop is not None and attention.slots is not None:
            hidden = self._layer_loop.hidden_states(ids, positions, attention.slots)
        else:
            hidden = self.model.hidden_states(ids, positions, attention)
        last = torch.tensor([len(p) - 1 for p in pending])
        return self.model.lm_head(hidden[torch.arange(len(pending)), last]).float()

    def _prompt_logprobs(self, seq: Sequence, hidden: torch.Tensor) -> list[list[Any]]:
        logp = torch.log_softmax(self.model.lm_head(hidden).float(), dim=-1)
        ids = seq.full_ids[: hidden.shape[0]]
        values = logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].tolist()
        triples = [[None, ids[0], None]] + [[v, t, None] for v, t in zip(values, ids[1:])]
        return triples[seq.req.logprob_start_len :]

    def _advance(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        params = [s.req.params for s in seqs]
        tensors = SamplingTensors.build(
            [p.temperature for p in params],
            [p.top_p for p in params],
            [p.top_k for p in params],
            [p.min_p for p in params],
        )
        matchers = [s.matcher for s in seqs]
        grammars = self._masker is not None and any(m is not None for m in matchers)
        held = [
            b
            for b, seq in enumerate(seqs)
            if seq.n_output < seq.req.params.min_new_tokens and seq.stop_ids
        ]
        # Reported: the temperature-scaled softmax over the whole vocabulary, taken before any
        # mask or truncation changes the logits (sampling.py says why).
        reported = (
            reported_logprobs(logits, tensors)
            if grammars or held or tensors.truncates(logits.shape[-1])
            else None
        )
        if grammars:
            self._apply_grammars(seqs, logits)
        for b in held:
            logits[b, list(seqs[b].stop_ids)] = float("-inf")
        logp = final_logprobs(logits, tensors)
        tokens = sample(logp, tensors.top_k == 1, [s.generator for s in seqs])
        if reported is not None:
            logp = reported
        chosen = logp.gather(1, tokens[:, None]).squeeze(1).tolist()
        for b, (seq, token) in enumerate(zip(seqs, tokens.tolist())):
            seq.add_token(token, chosen[b], self.weight_version)
            if seq.req.return_logprob and seq.req.top_logprobs_num > 0:
                values, ids = logp[b].topk(seq.req.top_logprobs_num)
                seq.output_top_logprobs.append(
                    [[v, i, None] for v, i in zip(values.tolist(), ids.tolist())]
                )
            self.tokens_generated += 1
            self._check_finished(seq, token)
            if seq.finish is None and seq.req.stream:
                self._stream_step(seq)

    def _stream_step(self, seq: Sequence) -> None:
        """One chunk after a new token: only what it adds, or the whole output so far."""
        if seq.chunker is None:
            seq.emit(seq.payload(self.weight_version, self._text(seq), self._token_text), False)
            return
        piece = seq.chunker.step(seq.full_ids, seq.prompt_len)
        seq.emit(seq.chunk(self.weight_version, piece, self._token_text), False)

    def _apply_grammars(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        """Mask what each grammar forbids. Once a grammar is complete it allows the server's stop
        tokens; a request's own ``stop_token_ids`` are let through here too."""
        assert self._masker is not None
        extra: list[tuple[int, list[int], torch.Tensor]] = []
        for b, seq in enumerate(seqs):
            ids = list(seq.req.params.stop_token_ids or ())
            if seq.matcher is not None and ids and seq.matcher.can_stop():
                extra.append((b, ids, logits[b, ids].clone()))
        self._masker.apply(logits, [s.matcher for s in seqs])
        for b, ids, saved in extra:
            logits[b, ids] = saved

    def _check_finished(self, seq: Sequence, token: int) -> None:
        params = seq.req.params
        if seq.matcher is not None and (
            not seq.matcher.accept_token(token) or seq.matcher.is_terminated()
        ):
            self._finish(seq, {"type": "stop", "matched": token})
            return
        if token in seq.stop_ids and seq.n_output > params.min_new_tokens - 1:
            self._finish(seq, {"type": "stop", "matched": token})
            return
        if params.stop and self._stop_string_in_tail(seq):
            text = self._text(seq)
            found = [(text.find(s), s) for s in params.stop if s in text]
            at, stop = min(found)
            seq.text = text[: at + len(stop)] if params.no_stop_trim else text[:at]
            self._finish(seq, {"type": "stop", "matched": stop}, text_ready=True)
            return
        if seq.n_output >= params.max_new_tokens:
            self._finish(seq, {"type": "length", "length": seq.n_output})

    def _stop_string_in_tail(self, seq: Sequence) -> bool:
        """Decode only the last few tokens: every token adds at least one byte, so a stop string of
        c characters (at most 4c bytes) that the newest token completed lies within 4c + 4 tokens."""
        stops = seq.req.params.stop or []
        window = 4 * max(len(s) for s in stops) + 4
        start = max(seq.prompt_len, len(seq.full_ids) - window)
        tail = self.decode(seq.full_ids[start:], seq.req.params.skip_special_tokens)
        return any(s in tail for s in stops)

    def _token_text(self, token: int) -> str:
        return self.decode([token], False)

    def _text(self, seq: Sequence) -> str:
        return self.decode(seq.output_ids, seq.req.params.skip_special_tokens)

    def _finish(self, seq: Sequence, reason: dict[str, Any], text_ready: bool = False) -> None:
        seq.finish = reason
        self._release(seq)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        text = seq.text if text_ready else self._text(seq)
        if seq.chunker is not None:
            piece = seq.chunker.finish(text, seq.req.rid)
            seq.emit(seq.chunk(self.weight_version, piece, self._token_text), True)
        else:
            seq.emit(seq.payload(self.weight_version, text, self._token_text), True)

    def _release(self, seq: Sequence) -> None:
        if seq.slots is not None:
            self.pool.release(seq.slots)
            seq.slots = None


def _decode_attention(wanted: bool | None, dtype: torch.dtype) -> dict[str, Any]:
    """Whether decode steps attend in the C++ kernel, and why (for ``/server_info``)."""
    if wanted is False:
        return {"kernel": False, "detail": "turned off (--no-decode-kernel)"}
    if dtype != torch.float32:
        detail = f"the KV pool is {dtype}; the kernel reads float32 only"
    else:
        status = decode_kernel.load()
        if status.loaded:
            return {"kernel": True, "detail": status.detail}
        detail = status.detail
    if wanted:
        raise RuntimeError(f"--decode-kernel: the decode attention kernel is unavailable: {detail}")
    return {"kernel": False, "detail": detail}


def _next_version(version: str) -> str:
    """ "7" -> "8", "v9" -> "v10"; a version without a trailing number gets "-1" appended."""
    match = re.fullmatch(r"(.*?)(\d+)", version)
    if match is None:
        return f"{version}-1"
    return f"{match.group(1)}{int(match.group(2)) + 1}"
