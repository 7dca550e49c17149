"""Elastic engines: the gateway's generation throughput with 1 engine, then with a 2nd one attached
to the running gateway by ``areal serve inference --attach``, measured in the same run.

Run: ``.venv/bin/python bench/elastic_engines.py [--rounds 3] [--seconds 20] [--clients 64]
[--json PATH]``.

Every server is a real process on 127.0.0.1: ``areal serve gateway`` started with no engine (and
an admin token), engine 1 ``areal serve inference --attach`` pinned to core 0 (``taskset -c 0``,
one torch thread), engine 2 the same command pinned to core 1. The gateway and the load driver
(this process) are not pinned; they are light, and the report gives the cores they used.

A **sample** is one chat completion through the gateway's OpenAI route with exactly
``--tokens`` new tokens (``max_tokens`` with ``ignore_eos``); ``--clients`` concurrent clients
send them back to back for the whole run, their first calls spread over ``--ramp`` seconds (equal
samples started together would finish together, in waves). 128 clients keep each engine at its
plateau; 32 (16 per engine with two) leave the engines batch-starved (docs/benchmarks.md). Each round measures ``--seconds`` with engine 1
alone, then starts engine 2 (the time until it printed "attached" is its time to join), waits
``--settle`` seconds (about one sample's time, for the calls to spread over both), measures
``--seconds`` with both, then SIGTERMs engine 2 (it detaches, draining its calls, and exits) and
settles again. Figures are samples whose answer arrived inside the window, per second, beside the
tokens the engines say they generated in it (``/server_info``); the ratio is 2-engine / 1-engine
of the medians over rounds (each round's own ratio is printed too). Failed calls are counted: an
attach or a drained detach should cost none.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import aiohttp  # noqa: E402
import psutil  # noqa: E402
from load_monitor import BUSY_CORES, LoadMonitor  # noqa: E402

from areal.host.process import ServerProcess, pick_free_port  # noqa: E402
from areal.plugins.models.tiny import init_tiny  # noqa: E402

ADMIN_TOKEN = "bench-admin-token-0123456789"
GATEWAY_KEY = "bench-gateway-key-0123456789"
POLICY = "areal-bench"
ROUTER = f"model_routing:\n  policy_model:\n    model_id: {POLICY}\n    max_tokens: 1024\n"


@dataclasses.dataclass(frozen=True)
class Settings:
    size: str = "small"
    tokens: int = 64  # new tokens per sample
    clients: int = 128  # concurrent clients, for the whole run: 64 per engine with 2
    seconds: float = 30.0  # each measured window
    settle: float = 10.0  # after an engine joins or leaves (about one sample's time)
    ramp: float = 10.0  # the clients' first calls spread over this, so answers do not come in waves
    rounds: int = 3


# --- the load ------------------------------------------------------------------------------------


class Load(threading.Thread):
    """``clients`` concurrent chat calls, back to back, on an event loop of its own; each answer's
    arrival time, whether it succeeded and its new tokens."""

    def __init__(self, gateway_url: str, s: Settings) -> None:
        super().__init__(daemon=True, name="bench-load")
        self.url, self.s = gateway_url + "/v1/chat/completions", s
        self.done: list[tuple[float, bool, int]] = []
        self.errors: list[str] = []
        self._stop_event = threading.Event()
        self._starts = (i * s.ramp / s.clients for i in range(s.clients))

    def stop(self) -> None:
        self._stop_event.set()
        self.join(120)

    def window(self, start: float, end: float) -> tuple[int, int, int]:
        """Samples answered, their tokens, and failed calls in ``[start, end)``."""
        inside = [d for d in list(self.done) if start <= d[0] < end]
        ok = [d for d in inside if d[1]]
        return len(ok), sum(d[2] for d in ok), len(inside) - len(ok)

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.s.clients)
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            await asyncio.gather(*(self._client(http) for _ in range(self.s.clients)))

    async def _client(self, http: aiohttp.ClientSession) -> None:
        body = {
            "model": POLICY,
            "messages": [{"role": "user", "content": f"Write {self.s.tokens} tokens."}],
            "max_tokens": self.s.tokens,
            "ignore_eos": True,
        }
        headers = {"Authorization": f"Bearer {GATEWAY_KEY}"}
        await asyncio.sleep(next(self._starts))
        while not self._stop_event.is_set():
            try:
                async with http.post(self.url, json=body, headers=headers) as answer:
                    data = await answer.json(content_type=None)
                    ok = answer.status == 200
                    tokens = int(data["usage"]["completion_tokens"]) if ok else 0
                    if not ok:
                        self.errors.append(f"HTTP {answer.status}: {data}")
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as err:
                ok, tokens = False, 0
                self.errors.append(repr(err))
            self.done.append((time.monotonic(), ok, tokens))
            if not ok:
                await asyncio.sleep(0.1)


# --- the processes -------------------------------------------------------------------------------


def start_gateway(root: Path) -> tuple[ServerProcess, str]:
    config = root / "router.yaml"
    config.write_text(ROUTER)
    port = pick_free_port()
    command = [sys.executable, "-m", "areal", "serve", "gateway", "--config", str(config)]
    command += ["--port", str(port), "--log-dir", str(root / "gateway"), "--log-level", "warning"]
    env = {"AREAL_ADMIN_TOKEN": ADMIN_TOKEN, "AREAL_GATEWAY_KEY": GATEWAY_KEY}
    gateway = ServerProcess(command, log_path=root / "gateway.log", env=env, name="gateway")
    url = f"http://127.0.0.1:{port}"
    gateway.start().wait_healthy(url, timeout=120)
    return gateway, url


def start_engine(
    root: Path, model: Path, core: int, gateway_url: str, tag: str = ""
) -> tuple[ServerProcess, str]:
    """``areal serve inference --attach`` on one core, one torch thread; the process, its URL.
    ``tag`` names its log: one log per start, so an earlier start's lines are not read again."""
    port = pick_free_port()
    command = ["taskset", "-c", str(core), sys.executable, "-m", "areal", "serve", "inference"]
    command += ["--model", str(model), "--port", str(port), "--max-total-tokens", "16384"]
    command += ["--max-running-requests", "128", "--log-level", "warning"]
    command += ["--attach", gateway_url]
    env = {"AREAL_ADMIN_TOKEN": ADMIN_TOKEN, "OMP_NUM_THREADS": "1"}
    log = root / f"engine-core{core}{tag}.log"
    engine = ServerProcess(command, log_path=log, env=env, name=f"engine@core{core}")
    return engine.start(), f"http://127.0.0.1:{port}"


def wait_attached(engine: ServerProcess, timeout: float = 300.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in engine.log_path.read_text().splitlines():
            if line.startswith("attached "):
                return line
        if not engine.running:
            break
        time.sleep(0.05)
    raise RuntimeError(f"{engine.name} did not attach:\n{engine.log_tail()}")


def engine_counters(url: str) -> tuple[int, int, float, float]:
    """The engine's own counters (``/server_info``): tokens generated, decode steps, their
    milliseconds and the sequences they decoded, all since it started."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{url}/server_info", timeout=30) as answer:
        info = json.load(answer)
    steps = int(info.get("decode_steps") or 0)
    ms = steps * float(info.get("decode_ms_per_step") or 0.0)
    seqs = steps * float(info.get("decode_mean_batch") or 0.0)
    return int(info["tokens_generated"]), steps, ms, seqs


def engine_window(
    before: tuple[int, int, float, float], after: tuple[int, int, float, float], seconds: float
) -> dict[str, float]:
    """One engine over a window: tokens/s, and its decode steps' mean batch and duration."""
    tokens, steps, ms, seqs = (a - b for a, b in zip(after, before))
    return {
        "tokens_per_s": tokens / seconds,
        "decode_batch": seqs / steps if steps else 0.0,
        "decode_ms_per_step": ms / steps if steps else 0.0,
    }


def cpu_seconds(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


# --- one run -------------------------------------------------------------------------------------


def measure(root: Path, s: Settings) -> dict[str, Any]:
    if shutil.which("taskset") is None:
        raise SystemExit("error: this benchmark pins engines with taskset (util-linux)")
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("error: this benchmark needs 2 cores (one per engine)")
    model = root / "model"
    init_tiny(model, size=s.size, seed=0)
    monitor = LoadMonitor()
    monitor.start()
    gateway, gateway_url = start_gateway(root)
    engine1, url1 = start_engine(root, model, 0, gateway_url)
    load = Load(gateway_url, s)
    rounds: list[dict[str, Any]] = []
    try:
        print(wait_attached(engine1), flush=True)
        assert engine1.pid is not None and gateway.pid is not None
        load.start()
        time.sleep(s.ramp + s.settle)  # every client running, answers spread out
        for r in range(s.rounds):
            one = window(load, monitor, "1 engine", s, gateway.pid, [url1])
            started = time.monotonic()
            engine2, url2 = start_engine(root, model, 1, gateway_url, tag=f"-round{r + 1}")
            try:
                wait_attached(engine2)
                attach_s = time.monotonic() - started
                assert engine2.pid is not None
                affinity = sorted(psutil.Process(engine2.pid).cpu_affinity() or [])
                time.sleep(s.settle)
                two = window(load, monitor, "2 engines", s, gateway.pid, [url1, url2])
            finally:
                started = time.monotonic()
                code = engine2.stop(timeout=60)
                detach_s = time.monotonic() - started
            detached = [ln for ln in engine2.log_path.read_text().splitlines() if "detached" in ln]
            rounds.append(
                {
                    "one": one,
                    "two": two,
                    "ratio": two["samples_per_s"] / one["samples_per_s"],
                    "attach_s": attach_s,
                    "detach_s": detach_s,
                    "exit_code": code,
                    "engine2_cores": affinity,
                    "detached": detached[-1] if detached else None,
                }
            )
            print(round_line(r, rounds[-1]), flush=True)
            time.sleep(s.settle)
    finally:
        load.stop()
        engine1.stop(timeout=30)
        gateway.stop(timeout=30)
        monitor.stop()
    one_rate = statistics.median(r["one"]["samples_per_s"] for r in rounds)
    two_rate = statistics.median(r["two"]["samples_per_s"] for r in rounds)
    return {
        "settings": dataclasses.asdict(s),
        "sample": f"one chat completion of exactly {s.tokens} new tokens through the gateway",
        "rounds": rounds,
        "one_engine_samples_per_s": one_rate,
        "two_engines_samples_per_s": two_rate,
        "ratio": two_rate / one_rate,
        "errors": load.errors[:5],
        "error_count": len(load.errors),
    }


def window(
    load: Load,
    monitor: LoadMonitor,
    phase: str,
    s: Settings,
    gateway_pid: int,
    engine_urls: list[str],
) -> dict[str, Any]:
    me = os.getpid()
    cpu0 = {"gateway": cpu_seconds(gateway_pid), "driver": cpu_seconds(me)}
    counters0 = [engine_counters(url) for url in engine_urls]
    start = time.monotonic()
    with monitor.measuring(phase):
        time.sleep(s.seconds)
    end = time.monotonic()
    engines = [
        engine_window(before, engine_counters(url), end - start)
        for url, before in zip(engine_urls, counters0)
    ]
    used = {
        "gateway": (cpu_seconds(gateway_pid) - cpu0["gateway"]) / (end - start),
        "driver": (cpu_seconds(me) - cpu0["driver"]) / (end - start),
    }
    samples, tokens, failed = load.window(start, end)
    other = monitor.other_cores(phase)
    monitor.busy.pop(phase, None)  # each window its own figure
    return {
        "samples_per_s": samples / (end - start),
        "tokens_per_s": tokens / (end - start),
        "engine_tokens_per_s": sum(e["tokens_per_s"] for e in engines),
        "engines": engines,
        "samples": samples,
        "failed": failed,
        "gateway_cores": used["gateway"],
        "driver_cores": used["driver"],
        "other_load_cores": other,
    }


# --- the report ----------------------------------------------------------------------------------


def round_line(i: int, r: dict[str, Any]) -> str:
    one, two = r["one"], r["two"]
    each = "; ".join(
        f"{name} {e['tokens_per_s']:.0f} tok/s, decode batch {e['decode_batch']:.0f} "
        f"at {e['decode_ms_per_step']:.1f} ms/step"
        for name, e in zip(("engine 1", "engine 2"), two["engines"])
    )
    alone = one["engines"][0]
    return (
        f"round {i + 1}: 1 engine {one['samples_per_s']:.2f} samples/s, "
        f"2 engines {two['samples_per_s']:.2f} ({r['ratio']:.2f}x); engine 2 on cores "
        f"{r['engine2_cores']} attached in {r['attach_s']:.1f}s, left in {r['detach_s']:.1f}s "
        f"(exit {r['exit_code']}); failed calls {one['failed']} + {two['failed']}\n"
        f"  alone: {alone['tokens_per_s']:.0f} tok/s, decode batch {alone['decode_batch']:.0f} "
        f"at {alone['decode_ms_per_step']:.1f} ms/step; together: {each}"
    )


def report(res: dict[str, Any]) -> str:
    s = res["settings"]
    lines = [
        f"sample = {res['sample']}; {s['clients']} concurrent clients, `{s['size']}` model, "
        f"{s['seconds']:g}s windows, {len(res['rounds'])} rounds",
        f"{'':<10}{'samples/s':>10}{'tokens/s':>10}{'engines':>9}{'gateway':>9}{'driver':>8}"
        f"{'other':>7}",
    ]
    for phase in ("one", "two"):
        w = [r[phase] for r in res["rounds"]]
        lines.append(
            f"{'1 engine' if phase == 'one' else '2 engines':<10}"
            f"{statistics.median(x['samples_per_s'] for x in w):>10.2f}"
            f"{statistics.median(x['tokens_per_s'] for x in w):>10.0f}"
            f"{statistics.median(x['engine_tokens_per_s'] for x in w):>9.0f}"
            f"{statistics.median(x['gateway_cores'] for x in w):>9.2f}"
            f"{statistics.median(x['driver_cores'] for x in w):>8.2f}"
            f"{statistics.median(x['other_load_cores'] for x in w):>7.2f}"
        )
    lines.append(
        "(tokens/s: of the answers that arrived; engines: generated, the engines' own count; "
        "gateway, driver, other: cores used)"
    )
    lines.append(
        f"2 engines / 1 engine: {res['ratio']:.2f}x (medians; per round "
        + ", ".join(f"{r['ratio']:.2f}x" for r in res["rounds"])
        + ")"
    )
    attach = statistics.median(r["attach_s"] for r in res["rounds"])
    detach = statistics.median(r["detach_s"] for r in res["rounds"])
    lines.append(
        f"engine 2: attached {attach:.1f}s after its process started, SIGTERM to exit "
        f"{detach:.1f}s (median); failed calls in the run: {res['error_count']}"
    )
    busy = [
        r[p]["other_load_cores"]
        for r in res["rounds"]
        for p in ("one", "two")
        if r[p]["other_load_cores"] > BUSY_CORES
    ]
    if busy:
        lines.append(
            f"warning: other processes used up to {max(busy):.2f} cores during some windows; "
            "run again when the machine is quiet"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Settings()
    parser.add_argument("--size", default=defaults.size, choices=["nano", "tiny", "small"])
    parser.add_argument("--tokens", type=int, default=defaults.tokens)
    parser.add_argument("--clients", type=int, default=defaults.clients)
    parser.add_argument("--seconds", type=float, default=defaults.seconds)
    parser.add_argument("--settle", type=float, default=defaults.settle)
    parser.add_argument("--ramp", type=float, default=defaults.ramp)
    parser.add_argument("--rounds", type=int, default=defaults.rounds)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    s = Settings(
        size=args.size,
        tokens=args.tokens,
        clients=args.clients,
        seconds=args.seconds,
        settle=args.settle,
        ramp=args.ramp,
        rounds=args.rounds,
    )
    with tempfile.TemporaryDirectory(prefix="areal-elastic-") as tmp:
        res = measure(Path(tmp), s)
    print(report(res))
    if res["errors"]:
        print("first failed calls:", *res["errors"], sep="\n  ")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
