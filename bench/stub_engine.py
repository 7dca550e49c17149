"""A STUB inference engine that answers instantly, for the gateway benchmark.

It is not a model: every ``/generate`` returns ``max_new_tokens`` tokens (8 when not given) that
repeat the same 8 (real ids of the policy tokenizer, with their text, log-probs and weight
version) the moment the request is read, so a benchmark that puts the gateway in front of it
measures the gateway's own cost and nothing else. It speaks the SGLang native subset the gateway
uses (``/health``, ``/model_info``, ``/generate`` plain and streamed) and, for the peer baseline,
an equally instant OpenAI-compatible ``/v1/chat/completions`` (plain and streamed, always 8
tokens) that a LiteLLM proxy can forward to.

Streamed ``/generate`` chunks are incremental (what each token adds, as the embedded engine and
SGLang with ``--incremental-streaming-output`` send) or, with ``--chunking cumulative``, the
whole output so far (SGLang's default). ``GET /stats`` says how many bytes of streamed
``/generate`` answers it wrote, for the benchmark's bytes per stream.

Run alone: ``.venv/bin/python bench/stub_engine.py --port 30000 [--model-dir DIR]
[--chunking cumulative]`` (without ``--model-dir`` it writes a "nano" tiny model to a temporary
directory for its tokenizer).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

OUTPUT_TEXT = " The quick brown fox jumps over the lazy dog again and again"
OUTPUT_TOKENS = 8
CONTEXT_LENGTH = 16384
MAX_TOKENS = 8192  # the most tokens one /generate answers
CACHED_UP_TO = 64  # streams of at most this many tokens are built once and kept
WEIGHT_VERSION = "0"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


@dataclass(frozen=True)
class FixedOutput:
    """The one answer the stub gives: token ids, the text of each prefix, a log-prob per token."""

    ids: list[int]
    prefix_texts: list[str]  # prefix_texts[k] is the text of ids[: k + 1]
    logprobs: list[float]

    @property
    def text(self) -> str:
        return self.prefix_texts[-1]

    def pieces(self) -> list[str]:
        """The text each token adds (the 8 tokens are whole words, so their texts join)."""
        return [t[len(p) :] for p, t in zip(["", *self.prefix_texts], self.prefix_texts)]

    @classmethod
    def from_tokenizer(cls, model_dir: str | Path) -> FixedOutput:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
        ids = tok.encode(OUTPUT_TEXT, add_special_tokens=False).ids[:OUTPUT_TOKENS]
        if len(ids) < OUTPUT_TOKENS:
            raise ValueError(f"the tokenizer gives only {len(ids)} tokens for {OUTPUT_TEXT!r}")
        texts = [tok.decode(ids[: k + 1]) for k in range(len(ids))]
        return cls(ids, texts, [round(-0.25 - 0.05 * k, 4) for k in range(len(ids))])


class StubEngine:
    """The routes of the stub; everything it answers is computed once, at start-up."""

    def __init__(self, model_dir: str | Path, chunking: str = "incremental") -> None:
        self.model_dir = str(Path(model_dir).resolve())
        self.out = FixedOutput.from_tokenizer(model_dir)
        self.incremental = chunking == "incremental"
        self.info = {
            "model_path": self.model_dir,
            "served_model_name": "stub",
            "tokenizer_path": self.model_dir,
            "is_generation": True,
            "weight_version": WEIGHT_VERSION,
            "context_length": CONTEXT_LENGTH,
            "model_type": "qwen3",
            "stub": True,
            "stream_chunking": chunking,
        }
        # JSON of each of the 8 tokens, encoded once: a stream is joined from these.
        self.id_json = [str(t).encode() for t in self.out.ids]
        self.logprob_json = [
            json.dumps([lp, t, None]).encode()
            for lp, t in zip(self.out.logprobs, self.out.ids, strict=True)
        ]
        self.text_pieces = self.out.pieces()
        self.cache: dict[tuple[int, int], list[bytes]] = {}
        self.stream_bytes = 0
        self.streams = 0

    # --- SGLang native -----------------------------------------------------------------------

    def _generate_payload(self, n: int, prompt_tokens: int) -> dict[str, Any]:
        ids = [self.out.ids[i % OUTPUT_TOKENS] for i in range(n)]
        lps = [self.out.logprobs[i % OUTPUT_TOKENS] for i in range(n)]
        meta = self._meta(n, prompt_tokens, final=True)
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(lps, ids, strict=True)]
        text = "".join(self.text_pieces[i % OUTPUT_TOKENS] for i in range(n))
        return {"text": text, "output_ids": ids, "meta_info": meta}

    @staticmethod
    def _meta(k: int, prompt_tokens: int, final: bool) -> dict[str, Any]:
        return {
            "id": "stub",
            "prompt_tokens": prompt_tokens,
            "completion_tokens": k,
            "cached_tokens": 0,
            "finish_reason": {"type": "length", "length": k} if final else None,
            "weight_version": WEIGHT_VERSION,
            "weight_versions": [{"version": WEIGHT_VERSION, "start": 0, "end": k}],
            "e2e_latency": 0.0,
        }

    def _stream(self, n: int, prompt_tokens: int) -> list[bytes]:
        """The SSE chunks of an n-token stream: built once for short streams, else each time."""
        key = (n, prompt_tokens)
        chunks = self.cache.get(key)
        if chunks is None:
            chunks = [*self._chunks(n, prompt_tokens), b"data: [DONE]\n\n"]
            if n <= CACHED_UP_TO:
                self.cache[key] = chunks
        return chunks

    def _chunks(self, n: int, prompt_tokens: int) -> list[bytes]:
        chunks, text, all_ids, all_lps = [], "", b"", b""
        for k in range(1, n + 1):
            j = (k - 1) % OUTPUT_TOKENS
            if self.incremental:
                ids, lps, chunk_text = self.id_json[j], self.logprob_json[j], self.text_pieces[j]
            else:  # the whole output so far, as SGLang streams by default
                sep = b", " if k > 1 else b""
                all_ids += sep + self.id_json[j]
                all_lps += sep + self.logprob_json[j]
                text += self.text_pieces[j]
                ids, lps, chunk_text = all_ids, all_lps, text
            meta = json.dumps(self._meta(k, prompt_tokens, final=k == n)).encode()
            chunks.append(
                b'data: {"text": ' + json.dumps(chunk_text).encode()
                + b', "output_ids": [' + ids + b'], "meta_info": ' + meta[:-1]
                + b', "output_token_logprobs": [' + lps + b"]}}\n\n"
            )  # fmt: skip
        return chunks

    @staticmethod
    def _sse(payload: Any) -> bytes:
        return b"data: " + json.dumps(payload).encode() + b"\n\n"

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response(self.info)

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({"stream_bytes": self.stream_bytes, "streams": self.streams})

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        prompt_tokens = len(body.get("input_ids") or [])
        asked = (body.get("sampling_params") or {}).get("max_new_tokens") or OUTPUT_TOKENS
        n = max(1, min(int(asked), MAX_TOKENS))
        if not body.get("stream"):
            return web.json_response(self._generate_payload(n, prompt_tokens))
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)
        for chunk in self._stream(n, prompt_tokens):
            await response.write(chunk)
            self.stream_bytes += len(chunk)
        self.streams += 1
        return response

    # --- OpenAI-compatible (the backend of the LiteLLM baseline) ------------------------------

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        model = str(body.get("model") or "stub")
        cid = "chatcmpl-" + uuid.uuid4().hex[:12]
        created = int(time.time())
        usage = {"prompt_tokens": 16, "completion_tokens": OUTPUT_TOKENS, "total_tokens": 24}
        if not body.get("stream"):
            message = {"role": "assistant", "content": self.out.text}
            choice = {"index": 0, "message": message, "finish_reason": "length", "logprobs": None}
            return web.json_response(
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [choice],
                    "usage": usage,
                }
            )
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)
        base = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
        previous = ""
        for k, text in enumerate(self.out.prefix_texts):
            delta: dict[str, Any] = {"content": text[len(previous) :]}
            if k == 0:
                delta["role"] = "assistant"
            previous = text
            last = k == OUTPUT_TOKENS - 1
            choice = {"index": 0, "delta": delta, "finish_reason": "length" if last else None}
            await response.write(self._sse({**base, "choices": [choice]}))
        await response.write(self._sse({**base, "choices": [], "usage": usage}))
        await response.write(b"data: [DONE]\n\n")
        return response

    async def models(self, request: web.Request) -> web.Response:
        data = [{"id": "stub", "object": "model", "created": 0, "owned_by": "stub"}]
        return web.json_response({"object": "list", "data": data})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/model_info", self.model_info)
        app.router.add_get("/get_model_info", self.model_info)
        app.router.add_post("/generate", self.generate)
        app.router.add_get("/stats", self.stats)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="An instant stub inference engine (benchmarks).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument(
        "--model-dir", help="a model dir with tokenizer.json (default: a fresh nano)"
    )
    parser.add_argument(
        "--chunking",
        choices=("incremental", "cumulative"),
        default="incremental",
        help="streamed /generate chunks: what each token adds, or the whole output so far",
    )
    args = parser.parse_args(argv)
    model_dir = args.model_dir
    if model_dir is None:
        from areal.plugins.models.tiny import init_tiny

        model_dir = str(Path(tempfile.mkdtemp(prefix="areal-stub-")) / "nano")
        init_tiny(model_dir, size="nano", seed=0)
    web.run_app(
        StubEngine(model_dir, args.chunking).app(),
        host=args.host,
        port=args.port,
        print=None,
        access_log=None,
    )


if __name__ == "__main__":
    main()
