"""Check areal's SGLang backend against a real SGLang server (GPU machine; not run in CI).

Makes a tiny Qwen3-style model with ``areal model init-tiny`` (or takes ``--model DIR``), starts
``sglang.launch_server`` through :func:`areal.plugins.inference.sglang_backend.launch`, and checks
with :class:`~areal.plugins.inference.sglang_client.InferenceClient` every endpoint areal relies on.
Prints one PASS/FAIL line per check; exits 1 if any check fails.

    python bench/gpu/sglang_check.py [--model DIR] [--workdir DIR] [--extra-arg=--disable-cuda-graph]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from areal.core.inference_records import GenerateOutput, SamplingParams
from areal.plugins.inference.sglang_backend import SGLangServerConfig, launch
from areal.plugins.inference.sglang_client import InferenceClient

PROMPT_IDS = [1, 2, 3, 4, 5, 6, 7, 8]


def make_tiny_model(out: Path) -> Path:
    """``areal model init-tiny OUT --size small``, through the console script when it exists."""
    script = Path(sys.executable).with_name("areal")
    if script.exists():
        base = [str(script)]
    elif shutil.which("areal"):
        base = ["areal"]
    else:
        base = [sys.executable, "-c", "from areal.cli.main import main; main()"]
    subprocess.run([*base, "model", "init-tiny", str(out), "--size", "small"], check=True)
    return out


def context_length(model: Path) -> int:
    config = json.loads((model / "config.json").read_text())
    return int(config.get("max_position_embeddings", 2048))


class Checks:
    def __init__(self) -> None:
        self.results: list[tuple[str, bool, str]] = []

    async def run(self, name: str, check: Callable[[], Awaitable[str | None]]) -> None:
        started = time.monotonic()
        try:
            note = await check() or ""
            ok = True
        except Exception as exc:  # report every failure, keep checking
            ok, note = False, f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        took = time.monotonic() - started
        self.results.append((name, ok, note))
        print(f"{'PASS' if ok else 'FAIL'} {name} ({took:.2f}s) {note}", flush=True)

    @property
    def failed(self) -> list[str]:
        return [name for name, ok, _ in self.results if not ok]


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


async def stream_until(
    client: InferenceClient, n_chunks: int, action: Callable[[], Awaitable[Any]], **kwargs: Any
) -> list[GenerateOutput]:
    """Stream a long generation and run ``action`` once ``n_chunks`` chunks have arrived."""
    chunks: list[GenerateOutput] = []
    async for chunk in client.generate_stream(**kwargs):
        chunks.append(chunk)
        if len(chunks) == n_chunks:
            await action()
    return chunks


async def run_checks(client: InferenceClient, model: Path, checks: Checks) -> None:
    long_tokens = max(64, min(4000, context_length(model) - len(PROMPT_IDS) - 8))
    short = SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True)
    long = SamplingParams(max_new_tokens=long_tokens, temperature=1.0, ignore_eos=True)

    async def health() -> str:
        expect(await client.health(), "/health did not answer 200")
        return ""

    async def model_info() -> str:
        info = await client.model_info()
        expect("model_path" in info, f"no model_path in {info}")
        return f"weight_version={info.get('weight_version')!r}"

    async def generate_ids() -> str:
        out = await client.generate(input_ids=PROMPT_IDS, sampling_params=short)
        expect(len(out.output_ids) == 16, f"{len(out.output_ids)} tokens, wanted 16")
        expect(
            out.finish_reason is not None and out.finish_reason.type == "length",
            f"{out.finish_reason}",
        )
        expect(out.prompt_tokens == len(PROMPT_IDS), f"prompt_tokens={out.prompt_tokens}")
        return f"ids={out.output_ids[:6]}... version={out.weight_version}"

    async def generate_text() -> str:
        out = await client.generate(text="The capital of France is", sampling_params=short)
        expect(isinstance(out.text, str) and len(out.output_ids) == 16, f"text={out.text!r}")
        return f"text={(out.text or '')[:40]!r}"

    async def logprobs() -> str:
        out = await client.generate(
            input_ids=PROMPT_IDS, sampling_params=short, return_logprob=True
        )
        triples = out.meta_info["output_token_logprobs"]
        expect(len(triples) == len(out.output_ids) == len(out.output_logprobs), "length mismatch")
        expect([t[1] for t in triples] == out.output_ids, "triple token ids differ from output_ids")
        expect(
            all(math.isfinite(lp) and lp <= 0 for lp in out.output_logprobs), "bad logprob values"
        )
        return f"first={out.output_logprobs[:3]}"

    async def stream() -> str:
        plain = await client.generate(input_ids=PROMPT_IDS, sampling_params=short)
        chunks = [
            c async for c in client.generate_stream(input_ids=PROMPT_IDS, sampling_params=short)
        ]
        final = chunks[-1]
        joined = [t for c in chunks for t in c.delta_output_ids]
        expect(final.finished and joined == final.output_ids, "deltas do not add up to the output")
        expect(final.completion_tokens == len(final.output_ids) == 16, f"{final.completion_tokens}")
        expect(len(final.output_logprobs) == 16, f"{len(final.output_logprobs)} logprobs")
        same = "same as" if final.output_ids == plain.output_ids else "DIFFERENT from"
        return f"{len(chunks)} chunks, greedy ids {same} non-stream"

    async def pause_abort_continue() -> str:
        chunks = await stream_until(
            client,
            4,
            lambda: client.pause_generation("abort"),
            input_ids=PROMPT_IDS,
            sampling_params=long,
        )
        final = chunks[-1]
        expect(final.aborted, f"finish_reason={final.finish_reason}")
        expect(len(final.output_ids) < long_tokens, "generation ran to the end")
        await client.continue_generation()
        after = await client.generate(input_ids=PROMPT_IDS, sampling_params=short)
        expect(len(after.output_ids) == 16, "generation after continue failed")
        return f"aborted after {len(final.output_ids)} of {long_tokens} tokens"

    async def update_weights() -> str:
        before = (await client.model_info()).get("weight_version")
        answer = await client.update_weights_from_disk(str(model), weight_version="areal-check-1")
        info = await client.model_info()
        out = await client.generate(input_ids=PROMPT_IDS, sampling_params=short)
        expect(
            info.get("weight_version") == "areal-check-1",
            f"model_info says {info.get('weight_version')}",
        )
        expect(out.weight_version == "areal-check-1", f"generate says {out.weight_version}")
        return f"{before!r} -> {out.weight_version!r}: {answer.get('message')}"

    async def abort_by_rid() -> str:
        rid = "areal-check-abort"
        chunks = await stream_until(
            client,
            4,
            lambda: client.abort_request(rid=rid),
            input_ids=PROMPT_IDS,
            sampling_params=long,
            rid=rid,
        )
        expect(chunks[-1].aborted, f"finish_reason={chunks[-1].finish_reason}")
        return f"aborted after {len(chunks[-1].output_ids)} tokens"

    async def flush() -> str:
        expect(await client.flush_cache(), "/flush_cache refused while idle")
        return ""

    for name, check in [
        ("health", health),
        ("model_info", model_info),
        ("generate_input_ids", generate_ids),
        ("generate_text", generate_text),
        ("logprobs", logprobs),
        ("stream", stream),
        ("pause_abort_continue", pause_abort_continue),
        ("update_weights_from_disk", update_weights),
        ("abort_request_by_rid", abort_by_rid),
        ("flush_cache", flush),
    ]:
        await checks.run(name, check)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="model dir (default: areal model init-tiny)")
    parser.add_argument(
        "--workdir", type=Path, help="where the model and the log go (default: a temp dir)"
    )
    parser.add_argument("--mem-fraction-static", type=float, default=0.3)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for /health")
    parser.add_argument("--extra-arg", action="append", default=[], help="passed to launch_server")
    args = parser.parse_args()

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="areal-sglang-check-"))
    workdir.mkdir(parents=True, exist_ok=True)
    model = args.model or make_tiny_model(workdir / "tiny-model")
    log_path = workdir / "sglang.log"
    config = SGLangServerConfig(
        model_path=str(model),
        port=0,
        mem_fraction_static=args.mem_fraction_static,
        extra_args=args.extra_arg,
    )
    print(f"model {model}, log {log_path}", flush=True)
    checks = Checks()
    started = time.monotonic()
    try:
        server = launch(config, log_path, timeout=args.timeout)
    except Exception as exc:
        print(f"FAIL launch: {exc}", flush=True)
        return 1
    print(f"PASS launch ({time.monotonic() - started:.1f}s) {server.url}", flush=True)

    async def go() -> None:
        async with InferenceClient(server.url or config.url, timeout=120) as client:
            await run_checks(client, model, checks)

    try:
        asyncio.run(go())
    finally:
        server.stop()
    if checks.failed:
        print(f"\n{len(checks.failed)} check(s) failed: {', '.join(checks.failed)}")
        print(f"--- last lines of {log_path} ---\n{server.log_tail()}")
        return 1
    print(f"\nall {len(checks.results)} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
