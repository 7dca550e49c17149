"""One inference backend (``sglang`` or ``vllm``) on a GPU, driven the way a run drives it.

The server starts from the backend's registered launcher with the run's backend-neutral options,
and areal's client for that backend (``engine_client``) runs the endpoint checks of
``sglang_check.py`` plus per-token versions across a weight update made mid-request in each pause
mode. One PASS/FAIL line per check; exit 1 if any fails. Not run in CI.

    python bench/gpu/engines_check.py --backend vllm --model DIR [--workdir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_check import PROMPT_IDS, Checks, expect, run_checks

from areal.core.engine_client import EngineClient, engine_client
from areal.core.plugins import registry
from areal.host.process import ServerProcess, pick_free_port
from areal.run.processes import server_env


async def versions_across_update(
    client: EngineClient, trainer: EngineClient, model: Path, mode: str, version: str
) -> str:
    """A long stream; after 8 chunks: pause (``mode``), reload the weights as ``version``,
    continue. The answer must label the tokens before and after the switch."""
    params = {"max_new_tokens": 512, "temperature": 1.0, "ignore_eos": True}
    last: Any = None
    n = 0
    async for chunk in client.generate_stream(input_ids=PROMPT_IDS, sampling_params=params):
        last, n = chunk, n + 1
        if n == 8:
            await trainer.pause_generation(mode)  # type: ignore[arg-type]
            await trainer.update_weights_from_disk(str(model), weight_version=version)
            await trainer.continue_generation()
    expect(last is not None and len(last.output_ids) == 512, "the request did not finish whole")
    versions = last.token_versions()
    spans = [(s.version, s.start, s.end) for s in last.weight_versions]
    expect(
        versions[-1] == version,
        f"last token's version {versions[-1]!r}, wanted {version!r}: {spans}",
    )
    expect(versions[0] != version, "the first tokens should carry the version before the update")
    return f"spans {[(s.version, s.start, s.end) for s in last.weight_versions]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", required=True, choices=["sglang", "vllm"])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--python", help="the interpreter that has the engine (default: its own)")
    parser.add_argument("--mem-fraction-static", type=float, default=0.3)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix=f"areal-{args.backend}-check-"))
    workdir.mkdir(parents=True, exist_ok=True)
    spec = registry("inference_backends").get(args.backend)
    port = pick_free_port()
    options: dict[str, Any] = {
        "model_path": str(args.model),
        "port": port,
        "max_running_requests": 64,
        "weight_version": "0",
        "seed": 0,
        "log_level": "warning",
        "tp_size": 1,
        "mem_fraction_static": args.mem_fraction_static,
    }
    if args.python:
        options["python_executable"] = args.python
    log_path = workdir / f"{args.backend}.log"
    env = {**os.environ, **server_env(spec.env)}
    server = ServerProcess(spec.load_launcher()(options), log_path=log_path, env=env)
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    try:
        server.start()
        server.wait_healthy(url, args.timeout)
    except Exception as exc:
        server.stop()
        print(f"FAIL {args.backend} launch: {exc}\n{server.log_tail()}", flush=True)
        return 1
    print(f"PASS {args.backend} launch ({time.monotonic() - started:.1f}s) {url}", flush=True)
    checks = Checks()

    async def go() -> None:
        client = engine_client(args.backend, url, timeout=120)
        trainer = engine_client(args.backend, url, timeout=300)
        try:
            await run_checks(client, args.model, checks)  # type: ignore[arg-type]
            for i, mode in enumerate(("in_place", "retract"), start=1):

                async def across(mode: str = mode, version: str = f"areal-v{i}") -> str:
                    return await versions_across_update(client, trainer, args.model, mode, version)

                await checks.run(f"versions_across_update_{mode}", across)
        finally:
            await client.aclose()
            await trainer.aclose()

    try:
        asyncio.run(go())
    finally:
        server.stop()
    if checks.failed:
        print(f"{args.backend}: {len(checks.failed)} check(s) failed: {', '.join(checks.failed)}")
        print(f"--- last lines of {log_path} ---\n{server.log_tail()}")
        return 1
    print(f"{args.backend}: all {len(checks.results)} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
