"""Collective weight sync over NCCL to a real SGLang or vLLM server (GPU machine; not run in CI).

The trainer (this process, on GPU 0) and the engine (its own process, on GPU 1: NCCL refuses two
ranks of one group on one device) form a group through the engine's join call (SGLang's
``/init_weights_update_group``; vLLM's ``/collective_rpc`` into areal's worker extension);
:class:`~areal.plugins.trainer.collective_sync.CollectiveWeightSync` then broadcasts perturbed
weights in buckets, and the server must report the new version and generate what the trainer's
model predicts greedily (first tokens; bf16/fp32 numerics may part later). Prints PASS/FAIL
lines; exits 1 on failure, 2 (SKIP) with fewer than two GPUs.

    python bench/gpu/check_nccl_sync.py [--backend sglang|vllm] [--python VLLM_PYTHON]
        [--workdir DIR] [--mem-fraction-static 0.3]
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

from areal.core.engine_client import engine_client
from areal.host.process import ServerProcess, start_on_free_port
from areal.plugins.models.hf_io import load_model
from areal.plugins.trainer.collective_sync import CollectiveWeightSync

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
ENGINE_GPU = {"CUDA_VISIBLE_DEVICES": "1"}  # the trainer keeps GPU 0


def predicted(model: torch.nn.Module, n: int) -> list[int]:
    ids = list(PROMPT)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids], device="cuda"))[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(PROMPT) :]


async def check(backend: str, url: str, model_dir: Path) -> str:
    model = load_model(model_dir, device="cuda")
    generator = torch.Generator(device="cuda").manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator, device="cuda") * 0.05)
    sync = CollectiveWeightSync(
        [url], backend="nccl", bucket_bytes=4 * 1024**2, update_timeout=120, engine_backend=backend
    )
    try:
        seconds = await sync.publish(model, 1)
        phases = dict(sync.last_phases)
    finally:
        await sync.close()
    client = engine_client(backend, url, timeout=120)
    try:
        out = await client.generate(
            input_ids=PROMPT,
            sampling_params={"max_new_tokens": 4, "temperature": 0, "ignore_eos": True},
        )
    finally:
        await client.aclose()
    versions = set(out.token_versions()) if out.spans_known else {out.weight_version}
    if versions != {"1"}:
        raise AssertionError(f"the server's tokens carry versions {versions}, not '1'")
    want = predicted(model, 4)
    if out.output_ids[:2] != want[:2]:
        raise AssertionError(f"greedy tokens {out.output_ids} != the trainer's {want}")
    shown = ", ".join(f"{k} {v:.2f}s" for k, v in phases.items())
    return f"published in {seconds:.2f}s ({shown}); greedy {out.output_ids} vs {want}"


def start_engine(args: argparse.Namespace, model_dir: Path, workdir: Path) -> ServerProcess:
    if args.backend == "sglang":
        from areal.plugins.inference.sglang_backend import SGLangServerConfig, launch

        config = SGLangServerConfig(
            model_path=str(model_dir), port=0, mem_fraction_static=args.mem_fraction_static
        )
        return launch(config, workdir / "sglang.log", timeout=600, env=ENGINE_GPU)
    from areal.plugins.inference.vllm_backend import SERVER_ENV, engine_command

    options = {
        "model_path": str(model_dir),
        "mem_fraction_static": args.mem_fraction_static,
        "python_executable": args.python or sys.executable,
        "log_level": "warning",
    }
    return start_on_free_port(
        lambda port: engine_command({**options, "port": port}),
        log_path=workdir / "vllm.log",
        timeout=600,
        env={**SERVER_ENV, **ENGINE_GPU},
        name="vllm",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["sglang", "vllm"], default="sglang")
    parser.add_argument("--python", help="vLLM's interpreter (default: this one)")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--mem-fraction-static", type=float, default=0.3)
    args = parser.parse_args()
    if torch.cuda.device_count() < 2:
        print(f"SKIP {args.backend} nccl weight sync: needs 2 GPUs (NCCL refuses two ranks on one)")
        return 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="areal-nccl-sync-"))
    model_dir = make_tiny_model(workdir / "tiny-model")
    started = time.monotonic()
    server = start_engine(args, model_dir, workdir)
    print(
        f"PASS launch {args.backend} ({time.monotonic() - started:.1f}s) {server.url}", flush=True
    )
    try:
        assert server.url is not None
        note = asyncio.run(check(args.backend, server.url, model_dir))
    except Exception as exc:
        print(f"FAIL {args.backend} nccl weight sync: {type(exc).__name__}: {exc}", flush=True)
        print(server.log_tail())
        return 1
    finally:
        server.stop()
    print(f"PASS {args.backend} nccl weight sync: {note}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
