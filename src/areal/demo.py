"""``make demo``: the main job on the embedded default, start to finish on a laptop CPU.

Today it shows the inference side every later part stands on: it creates the tiny default model,
starts the embedded engine as its own process, streams a chat reply, forces a valid tool call out
of the untrained model with constrained decoding, serves concurrent requests with continuous
batching, and swaps the weights while a generation is running, reading back which policy version
produced which token. (The issue on asynchronous RL turns this into a full training run.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from areal.core.inference_client import GenerateOutput, InferenceClient
from areal.core.process import ServerProcess, pick_free_port
from areal.plugins.inference.embedded.launcher import EmbeddedServerConfig, build_command

console = Console()

TOOL_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"const": "get_weather"},
        "arguments": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}},
            "required": ["city"],
        },
    },
    "required": ["name", "arguments"],
}


def prepare_model(out: Path, size: str) -> Path:
    from areal.plugins.models.tiny import init_tiny

    model_dir = out / "model"
    if (model_dir / "config.json").is_file():
        console.print(f"[dim]model: reusing {model_dir}[/dim]")
        return model_dir
    summary = init_tiny(model_dir, size=size, seed=0)
    console.print(
        f"model: wrote the embedded default ({summary['parameters'] / 1e6:.2f}M params) to {model_dir}"
    )
    return model_dir


def perturbed_copy(model_dir: Path, out: Path) -> Path:
    """A stand-in for a trainer step: the same model with slightly moved weights."""
    import torch

    from areal.plugins.models.hf_io import load_model, save_model

    model = load_model(model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    save_model(model, out)
    return out


def chat_prompt(model_dir: Path, user: str) -> str:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
    )
    return str(text)


async def run(client: InferenceClient, model_dir: Path, out: Path) -> dict[str, object]:
    info = await client.model_info()
    console.print(f"engine: {info['model_type']} served, weight version {info['weight_version']}")

    console.rule("1. a streamed chat reply (the model is untrained: expect gibberish)")
    prompt = chat_prompt(model_dir, "What is the capital of France?")
    shown = 0
    final: GenerateOutput | None = None
    async for chunk in client.generate_stream(
        text=prompt, sampling_params={"max_new_tokens": 32, "temperature": 0.8}
    ):
        text = chunk.text or ""
        console.print(text[shown:], end="", markup=False, highlight=False)
        shown, final = len(text), chunk
    assert final is not None
    console.print(
        f"\n[dim]{final.completion_tokens} tokens, finish {final.finish_reason.type if final.finish_reason else '?'}[/dim]"
    )

    console.rule("2. a forced tool call: constrained decoding makes even random weights valid")
    call = await client.generate(
        text=chat_prompt(model_dir, "Weather in Paris?") + "<tool_call>",
        sampling_params={
            "max_new_tokens": 96,
            "json_schema": json.dumps(TOOL_SCHEMA),
            "sampling_seed": 1,
        },
    )
    parsed = json.loads(call.text or "")
    console.print(f"tool call: {parsed}")

    console.rule("3. 16 concurrent requests share decode steps (continuous batching)")
    t0 = time.perf_counter()
    outs = await asyncio.gather(
        *(
            client.generate(
                input_ids=[10 + i] * 8, sampling_params={"max_new_tokens": 64, "ignore_eos": True}
            )
            for i in range(16)
        )
    )
    elapsed = time.perf_counter() - t0
    tokens = sum(o.completion_tokens for o in outs)
    stats = await client.server_info()
    console.print(
        f"{tokens} tokens in {elapsed:.2f}s = {tokens / elapsed:.0f} tok/s; "
        f"peak batch {stats['peak_running']}, KV cache {stats['kv_capacity_tokens']} tokens"
    )

    console.rule("4. new weights while a generation runs: every token knows its policy version")
    long = asyncio.create_task(
        client.generate(
            input_ids=[42, 43], sampling_params={"max_new_tokens": 400, "ignore_eos": True}
        )
    )
    new_dir = await asyncio.to_thread(perturbed_copy, model_dir, out / "model_v1")
    result = await client.update_weights_from_disk(str(new_dir))
    done = await long
    spans = ", ".join(f"v{s.version}: tokens {s.start}-{s.end}" for s in done.weight_versions)
    console.print(f"update: {result['message']}\nlong request: {spans}")
    return {
        "stream_tokens": final.completion_tokens,
        "tool_call": parsed,
        "concurrent_tok_s": round(tokens / elapsed, 1),
        "peak_batch": stats["peak_running"],
        "weight_versions": [s.version for s in done.weight_versions],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--output-dir", type=Path, default=Path("runs/demo"))
    parser.add_argument("--size", default="tiny", choices=["nano", "tiny", "small"])
    args = parser.parse_args(argv)
    out: Path = args.output_dir
    out.mkdir(parents=True, exist_ok=True)
    model_dir = prepare_model(out, args.size)
    port = pick_free_port()
    config = EmbeddedServerConfig(
        model_path=str(model_dir), port=port, max_total_tokens=16384, log_level="warning"
    )
    with ServerProcess(
        build_command(config), log_path=out / "engine.log", env=dict(os.environ)
    ) as server:
        url = f"http://127.0.0.1:{port}"
        server.wait_healthy(url, timeout=120)

        async def session() -> dict[str, object]:
            async with InferenceClient(url) as client:
                return await run(client, model_dir, out)

        summary = asyncio.run(session())
    table = Table(title="demo summary", show_header=False)
    for key, value in summary.items():
        table.add_row(key, str(value))
    console.print(table)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    console.print(f"[dim]engine log: {out / 'engine.log'}; summary: {out / 'summary.json'}[/dim]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
