"""Where a decode step's time goes: ``torch.profiler`` over the decode steps of one 16-row run.

Run: ``.venv/bin/python bench/decode_profile.py`` (``--eager`` for the eager step, ``--rows``,
``--size``, ``--top``). The engine is ``bench/decode_step.py``'s (greedy, 32-token prompts,
128 new tokens each, on the calling thread). Prints the step time unprofiled and profiled and the
ops with the most self CPU time, per decode step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from decode_step import NEW_TOKENS, build, one_round, prefilled
from torch.profiler import ProfilerActivity, profile

from areal.host.heap import keep_freed_memory
from areal.plugins.inference.embedded.engine import Engine


def profiled_round(engine: Engine, rows: int) -> tuple[float, profile]:
    """One round with the profiler on around the decode steps only: the median step (s)."""
    prefilled(engine, rows, seed=1)
    steps = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        while engine.running:
            start = time.perf_counter()
            engine._timed("decode", list(engine.running))
            steps.append(time.perf_counter() - start)
    return statistics.median(steps), prof


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--size", default="small")
    parser.add_argument("--eager", action="store_true", help="profile the eager step")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--pack",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="pre-packed weights (--no-pack: torch's own linear)",
    )
    args = parser.parse_args()
    keep_freed_memory()
    engine, _ = build(args.size, compile_decode=not args.eager, pack_weights=args.pack)
    one_round(engine, 2)
    plain = statistics.median(one_round(engine, args.rows)[0] for _ in range(3))
    step, prof = profiled_round(engine, args.rows)
    steps = NEW_TOKENS - 1  # the first token comes from the prefill
    print(
        f"{'eager' if args.eager else 'compiled'} decode step at {args.rows} rows: "
        f"{1000 * plain:.2f} ms unprofiled, {1000 * step:.2f} ms profiled"
    )
    print(f"{'op':60} {'self ms/step':>12} {'calls/step':>10}")
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    for event in events[: args.top]:
        print(
            f"{event.key[:60]:60} {event.self_cpu_time_total / 1000 / steps:12.3f} "
            f"{event.count / steps:10.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
