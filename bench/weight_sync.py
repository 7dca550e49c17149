"""Weight sync: disk (safetensors + ``/update_weights_from_disk``) against the collective broadcast
(``/update_weights_from_distributed`` over gloo), trainer -> one embedded engine process.

Run: ``.venv/bin/python bench/weight_sync.py [--size small] [--rounds 5] [--bucket-mb 64]``.

Both publish the same model (``areal model init-tiny``'s ``size``) to the same engine process,
``rounds`` times each after one warm-up (the collective's first publish also forms its group);
reported: median seconds per publish, the phases of the last one, and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from areal.gateway.server import embedded_engine
from areal.plugins.models.hf_io import load_model
from areal.plugins.models.tiny import init_tiny
from areal.plugins.trainer.collective_sync import CollectiveWeightSync, hf_tensors
from areal.plugins.trainer.weight_sync import DiskWeightSync


async def timed(sync: Any, model: Any, rounds: int) -> tuple[list[float], dict[str, float]]:
    times = []
    for version in range(1, rounds + 2):  # the first is a warm-up
        started = time.perf_counter()
        await sync.publish(model, version)
        if version > 1:
            times.append(time.perf_counter() - started)
    phases = dict(sync.last_phases)
    await sync.close()
    return times, phases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--bucket-mb", type=int, default=64)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / args.size
        init_tiny(path, size=args.size, seed=0)
        model = load_model(path)
        megabytes = sum(t.numel() * t.element_size() for t in hf_tensors(model).values()) / 1e6
        with embedded_engine(str(path), Path(tmp)) as url:
            disk = DiskWeightSync([url], Path(tmp) / "weights")
            collective = CollectiveWeightSync([url], bucket_bytes=args.bucket_mb * 1024**2)
            results = {}
            for name, sync in (("disk", disk), ("collective", collective)):
                times, phases = asyncio.run(timed(sync, model, args.rounds))
                results[name] = statistics.median(times)
                shown = ", ".join(f"{k} {v:.3f}" for k, v in phases.items())
                print(f"{name:10s} {results[name]:.3f} s per publish ({shown})")
    print(
        f"{megabytes:.1f} MB of weights; collective / disk time: "
        f"{results['collective'] / results['disk']:.2f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
