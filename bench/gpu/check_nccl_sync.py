"""Collective weight sync over NCCL to a real SGLang server (GPU machine; not run in CI).

The trainer (this process, on the GPU) and SGLang (its own process, same GPU) form a group through
SGLang's ``/init_weights_update_group``; :class:`~areal.plugins.trainer.collective_sync.
CollectiveWeightSync` then broadcasts perturbed weights in buckets, and the server must report the
new version and generate what the trainer's model predicts greedily (first tokens; bf16/fp32
numerics may part later). Prints PASS/FAIL lines; exits 1 on failure.

    python bench/gpu/check_nccl_sync.py [--workdir DIR] [--mem-fraction-static 0.3]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_check import make_tiny_model

from areal.core.inference_client import InferenceClient
from areal.plugins.inference.sglang_backend import SGLangServerConfig, launch
from areal.plugins.models.hf_io import load_model
from areal.plugins.trainer.collective_sync import CollectiveWeightSync

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def predicted(model: torch.nn.Module, n: int) -> list[int]:
    ids = list(PROMPT)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids], device="cuda"))[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(PROMPT) :]


async def check(url: str, model_dir: Path) -> str:
    model = load_model(model_dir, device="cuda")
    generator = torch.Generator(device="cuda").manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator, device="cuda") * 0.05)
    sync = CollectiveWeightSync([url], backend="nccl", bucket_bytes=4 * 1024**2, update_timeout=120)
    try:
        seconds = await sync.publish(model, 1)
        phases = dict(sync.last_phases)
    finally:
        await sync.close()
    async with InferenceClient(url, timeout=120) as client:
        out = await client.generate(
            input_ids=PROMPT,
            sampling_params={"max_new_tokens": 4, "temperature": 0, "ignore_eos": True},
        )
    if out.weight_version != "1":
        raise AssertionError(f"the server serves version {out.weight_version!r}, not '1'")
    want = predicted(model, 4)
    if out.output_ids[:2] != want[:2]:
        raise AssertionError(f"greedy tokens {out.output_ids} != the trainer's {want}")
    shown = ", ".join(f"{k} {v:.2f}s" for k, v in phases.items())
    return f"published in {seconds:.2f}s ({shown}); greedy {out.output_ids} vs {want}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--mem-fraction-static", type=float, default=0.3)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="areal-nccl-sync-"))
    model_dir = make_tiny_model(workdir / "tiny-model")
    config = SGLangServerConfig(
        model_path=str(model_dir), port=0, mem_fraction_static=args.mem_fraction_static
    )
    started = time.monotonic()
    server = launch(config, workdir / "sglang.log", timeout=600)
    print(f"PASS launch ({time.monotonic() - started:.1f}s) {server.url}", flush=True)
    try:
        note = asyncio.run(check(server.url or config.url, model_dir))
    except Exception as exc:
        print(f"FAIL nccl weight sync: {type(exc).__name__}: {exc}", flush=True)
        print(server.log_tail())
        return 1
    finally:
        server.stop()
    print(f"PASS nccl weight sync: {note}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
