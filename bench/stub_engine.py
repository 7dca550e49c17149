"""A STUB inference engine that answers instantly, for the gateway benchmark.

It is not a model: every ``/generate`` returns the same 8 tokens (real ids of the policy
tokenizer, with their text, log-probs and weight version) the moment the request is read, so a
benchmark that puts the gateway in front of it measures the gateway's own cost and nothing else.
It speaks the SGLang native subset the gateway uses (``/health``, ``/model_info``, ``/generate``
plain and streamed) and, for the peer baseline, an equally instant OpenAI-compatible
``/v1/chat/completions`` (plain and streamed) that a LiteLLM proxy can forward to.

Run alone: ``.venv/bin/python bench/stub_engine.py --port 30000 [--model-dir DIR]`` (without
``--model-dir`` it writes a "nano" tiny model to a temporary directory for its tokenizer).
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
CONTEXT_LENGTH = 4096
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

    def __init__(self, model_dir: str | Path) -> None:
        self.model_dir = str(Path(model_dir).resolve())
        self.out = FixedOutput.from_tokenizer(model_dir)
        self.info = {
            "model_path": self.model_dir,
            "served_model_name": "stub",
            "tokenizer_path": self.model_dir,
            "is_generation": True,
            "weight_version": WEIGHT_VERSION,
            "context_length": CONTEXT_LENGTH,
            "model_type": "qwen3",
            "stub": True,
        }
        self.sse_generate = [
            self._sse(self._generate_payload(k + 1, 0, final=k + 1 == OUTPUT_TOKENS))
            for k in range(OUTPUT_TOKENS)
        ]

    # --- SGLang native -----------------------------------------------------------------------

    def _generate_payload(self, n: int, prompt_tokens: int, final: bool) -> dict[str, Any]:
        ids = self.out.ids[:n]
        meta: dict[str, Any] = {
            "id": "stub",
            "prompt_tokens": prompt_tokens,
            "completion_tokens": n,
            "cached_tokens": 0,
            "finish_reason": {"type": "length", "length": n} if final else None,
            "weight_version": WEIGHT_VERSION,
            "weight_versions": [{"version": WEIGHT_VERSION, "start": 0, "end": n}],
            "output_token_logprobs": [
                [lp, t, None] for lp, t in zip(self.out.logprobs[:n], ids, strict=True)
            ],
            "e2e_latency": 0.0,
        }
        return {"text": self.out.prefix_texts[n - 1], "output_ids": ids, "meta_info": meta}

    @staticmethod
    def _sse(payload: Any) -> bytes:
        return b"data: " + json.dumps(payload).encode() + b"\n\n"

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response(self.info)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        prompt_tokens = len(body.get("input_ids") or [])
        if not body.get("stream"):
            payload = self._generate_payload(OUTPUT_TOKENS, prompt_tokens, final=True)
            return web.json_response(payload)
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)
        for chunk in self.sse_generate:  # cumulative chunks, one per token, as SGLang sends
            await response.write(chunk)
        await response.write(b"data: [DONE]\n\n")
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
    args = parser.parse_args(argv)
    model_dir = args.model_dir
    if model_dir is None:
        from areal.plugins.models.tiny import init_tiny

        model_dir = str(Path(tempfile.mkdtemp(prefix="areal-stub-")) / "nano")
        init_tiny(model_dir, size="nano", seed=0)
    web.run_app(
        StubEngine(model_dir).app(), host=args.host, port=args.port, print=None, access_log=None
    )


if __name__ == "__main__":
    main()
