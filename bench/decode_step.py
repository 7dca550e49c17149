"""Per-step time of the embedded engine's decode at 16 rows: the eager step vs ``--compile-decode``.

Run: ``.venv/bin/python bench/decode_step.py`` (``--rounds``, ``--rows``, ``--size``;
``--unpacked`` adds both steps on torch's own linear, without pre-packed weights, beside them).

The engines live in this process on the same weights and run the same requests (greedy, 32-token
prompts, 128 new tokens each) on the calling thread, no HTTP; rounds alternate so the machine's
drift hits all alike. Each round reports the median decode step; the medians of the rounds are
printed, with the compile time and whether all engines produced the same tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import torch

from areal.host.heap import keep_freed_memory
from areal.plugins.inference.embedded.engine import Engine, EngineConfig
from areal.plugins.inference.embedded.requests import Emit, SequenceRequest
from areal.plugins.inference.embedded.schema import SamplingParams
from areal.plugins.models.tiny import Qwen3ForCausalLM, tiny_config

PROMPT_LEN = 32
NEW_TOKENS = 128


def build(size: str, compile_decode: bool, pack_weights: bool = True) -> tuple[Engine, float]:
    """An engine on the seeded ``size`` model, and the seconds it took to start."""
    model = Qwen3ForCausalLM(tiny_config(size))
    model.init_weights(generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    config = EngineConfig(
        max_total_tokens=32768, compile_decode=compile_decode, pack_weights=pack_weights
    )
    engine = Engine(model, lambda ids, skip: "", [], config)
    return engine, time.perf_counter() - start


def _keep(out: dict[int, list[int]], i: int) -> Emit:
    def emit(payload: dict[str, Any], final: bool) -> None:
        if final:
            out[i] = payload["output_ids"]

    return emit


def prefilled(engine: Engine, rows: int, seed: int = 0) -> dict[int, list[int]]:
    """``rows`` seeded prompts admitted and prefilled; where each one's tokens will be kept."""
    g = torch.Generator().manual_seed(seed)
    out: dict[int, list[int]] = {}
    for i in range(rows):
        prompt = torch.randint(10, 4000, (PROMPT_LEN,), generator=g).tolist()
        params = SamplingParams.model_validate(
            {"max_new_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}
        )
        engine._enqueue(SequenceRequest(rid=str(i), input_ids=prompt, params=params), _keep(out, i))
    engine._admit()
    engine._timed("prefill", list(engine.running))
    return out


def one_round(engine: Engine, rows: int) -> tuple[float, list[list[int]]]:
    """Prefill ``rows`` prompts, decode them to the end: the median step (s) and the tokens."""
    out = prefilled(engine, rows)
    steps = []
    while engine.running:
        start = time.perf_counter()
        engine._timed("decode", list(engine.running))
        steps.append(time.perf_counter() - start)
    return statistics.median(steps), [out[i] for i in range(rows)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--size", default="small")
    parser.add_argument("--unpacked", action="store_true", help="also time unpacked weights")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    keep_freed_memory()  # as `areal serve inference` does
    engines = {"eager": build(args.size, False), "compiled": build(args.size, True)}
    if args.unpacked:
        engines["eager_unpacked"] = build(args.size, False, pack_weights=False)
        engines["compiled_unpacked"] = build(args.size, True, pack_weights=False)
    steps: dict[str, list[float]] = {name: [] for name in engines}
    tokens: dict[str, list[list[int]]] = {}
    for engine, _ in engines.values():
        one_round(engine, 2)  # warm-up
    for _ in range(args.rounds):
        for name, (engine, _) in engines.items():
            step, tokens[name] = one_round(engine, args.rows)
            steps[name].append(1000 * step)
    median = {name: statistics.median(values) for name, values in steps.items()}
    result: dict[str, Any] = {
        "size": args.size,
        "rows": args.rows,
        "torch_threads": torch.get_num_threads(),
        **{f"{name}_step_ms": round(ms, 2) for name, ms in median.items()},
        "speedup": round(median["eager"] / median["compiled"], 2),
        **{f"{name}_rounds_ms": [round(s, 2) for s in steps[name]] for name in steps},
        "compile_s": round(engines["compiled"][1], 1),
        "same_tokens": all(t == tokens["eager"] for t in tokens.values()),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"decode step at {args.rows} rows ({args.size}, {result['torch_threads']} threads), "
        f"median of {args.rounds} alternating rounds:"
    )
    for name, ms in median.items():
        print(f"  {name:18} {ms:7.2f} ms   rounds: {result[f'{name}_rounds_ms']}")
    print(
        f"  speedup {result['speedup']}x; compile (engine start) {result['compile_s']} s; "
        f"same tokens: {result['same_tokens']}; load average {result['load_average']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
