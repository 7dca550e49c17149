"""The gateway's CPU per training episode, against its CPU per bare chat call, in one run.

Run: ``.venv/bin/python bench/gateway_episode.py [--rounds 3] [--seconds 4] [--profile]``.

A rollout worker's episode is three calls to the gateway: open an RL session (admin token),
one chat completion with the session's own key, and end it with a reward, which assembles the
trajectory and puts it into the trainer's queue. Every part is real: the stub engine
(``bench/stub_engine.py``, 8 tokens the moment it reads a request), the gateway
(``python -m areal.gateway.server --sink zmq``) and the trainer's end of the queue
(``ZmqTrajectorySource``, drained by a thread of this process). ``--clients`` loops (16) run
back to back for ``--seconds`` per case and round; the cases alternate round by round:

- **chat**: the same chat request with the gateway's key, no session (the baseline);
- **episode**: open, chat, end (the trajectory acknowledged by the queue before ``end`` returns).

Printed per case: calls or episodes per second, and the gateway's CPU (user + system, from
/proc) per call and per episode; then the episode's CPU as a multiple of a chat call's: what
the session, the recording and the trajectory cost on top of the call itself (3 calls would be
3.0x if each cost a chat's). ``--profile`` then runs one more gateway under cProfile (CPU time)
for episodes only and prints where its time goes, by handler and by function.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import pstats
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from areal.host.process import pick_free_port
from areal.plugins.queues.zmq_queue import ZmqTrajectorySource
from gateway import (
    GATEWAY_KEY,
    MAX_TOKENS,
    MESSAGES,
    MODEL,
    cpu_seconds,
    gateway_command,
    profile_while,
    server,
    stub_command,
)

ADMIN_TOKEN = "bench-episode-admin-0123456789"
CHAT = {"model": MODEL, "messages": MESSAGES, "max_tokens": MAX_TOKENS}
CASES = ("chat", "episode")
# The handlers an episode's calls run through, for the profile's per-call split.
HANDLERS = (
    ("open (POST /rl/sessions)", "areal/gateway/session_api.py", "create"),
    ("chat (POST /v1/chat/completions)", "areal/gateway/openai_chat.py", "chat_completions"),
    ("end (POST /rl/sessions/{id}/end)", "areal/gateway/session_api.py", "end"),
    ("  the trajectory's put into the queue", "areal/plugins/queues/zmq_queue.py", "put"),
    ("access log", "areal/gateway/access_log.py", "write"),
)


class Failed(RuntimeError):
    """A call answered something other than 200."""


@dataclass
class Tally:
    done: list[int] = field(default_factory=list)  # calls or episodes per round
    seconds: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # the gateway's CPU seconds per round

    def per_s(self) -> float:
        return statistics.median(d / s for d, s in zip(self.done, self.seconds, strict=True))

    def cpu_ms(self) -> float:
        return statistics.median(1000 * c / d for c, d in zip(self.cpu, self.done, strict=True))


class Drain(threading.Thread):
    """The trainer's end: takes every trajectory the gateway delivers, as fast as it comes."""

    def __init__(self, source: ZmqTrajectorySource) -> None:
        super().__init__(daemon=True)
        self.source, self.taken, self.stopping = source, 0, False

    def run(self) -> None:
        while not self.stopping:
            if self.source.get(timeout=0.2) is not None:
                self.taken += 1


async def post(http: aiohttp.ClientSession, url: str, key: str, body: dict[str, Any]) -> Any:
    async with http.post(url, json=body, headers={"Authorization": f"Bearer {key}"}) as resp:
        payload = await resp.read()
        if resp.status != 200:
            raise Failed(f"{url}: HTTP {resp.status}: {payload[:200]!r}")
        return json.loads(payload)


async def chat(http: aiohttp.ClientSession, url: str) -> None:
    await post(http, f"{url}/v1/chat/completions", GATEWAY_KEY, CHAT)


async def episode(http: aiohttp.ClientSession, url: str) -> None:
    opened = await post(http, f"{url}/rl/sessions", ADMIN_TOKEN, {})
    await post(http, f"{url}/v1/chat/completions", opened["api_key"], CHAT)
    ended = await post(http, f"{url}/rl/sessions/{opened['session_id']}/end", ADMIN_TOKEN, {"reward": 1.0})  # fmt: skip
    if not ended.get("sent"):
        raise Failed(f"the episode's trajectory was not sent: {ended}")


async def window(url: str, case: str, clients: int, seconds: float) -> tuple[int, float]:
    """How many calls (or episodes) ``clients`` loops completed in ``seconds``, and the time."""
    call = chat if case == "chat" else episode
    connector = aiohttp.TCPConnector(limit=2 * clients)
    async with aiohttp.ClientSession(connector=connector) as http:
        for _ in range(clients):  # connections open and code paths warm before the clock
            await call(http, url)
        done, started = 0, time.perf_counter()
        deadline = started + seconds

        async def loop() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await call(http, url)
                done += 1

        await asyncio.gather(*(loop() for _ in range(clients)))
        return done, time.perf_counter() - started


def measure(url: str, pid: int, args: argparse.Namespace) -> dict[str, Tally]:
    tallies = {case: Tally() for case in CASES}
    for _ in range(args.rounds):
        for case in CASES:  # alternating: the machine's drift hits both alike
            before = cpu_seconds(pid)
            done, seconds = asyncio.run(window(url, case, args.clients, args.seconds))
            tallies[case].cpu.append(cpu_seconds(pid) - before)
            tallies[case].done.append(done)
            tallies[case].seconds.append(seconds)
    return tallies


def profile(stub_url: str, sink: list[str], work: Path, args: argparse.Namespace) -> None:
    """Episodes through a gateway under cProfile (CPU time), started and stopped by signals."""
    out = work / "episode.prof"
    port = pick_free_port()
    url = f"http://127.0.0.1:{port}"
    command = gateway_command(stub_url, port, work, out, "router-profiled", extra=sink)
    env = {"AREAL_GATEWAY_KEY": GATEWAY_KEY, "AREAL_ADMIN_TOKEN": ADMIN_TOKEN}
    with server("gateway-profiled", command, f"{url}/health", work, env) as proc:
        assert proc.pid is not None
        asyncio.run(window(url, "episode", args.clients, 1.0))  # warm
        episodes = lambda: asyncio.run(window(url, "episode", args.clients, args.seconds))  # noqa: E731
        done, _ = profile_while(proc.pid, out, episodes)
    raw: dict[Any, Any] = pstats.Stats(str(out)).stats  # type: ignore[attr-defined]
    busy = sum(v[2] for k, v in raw.items() if "poll" not in k[2] and "select" not in k[2])
    print(f"\nunder cProfile: {1000 * busy / done:.3f} ms of CPU per episode ({done} episodes)")
    for label, file_end, func in HANDLERS:
        cum = sum(v[3] for k, v in raw.items() if k[0].endswith(file_end) and k[2] == func)
        print(f"  {label:<42} {1000 * cum / done:7.3f} ms per episode (cumulative)")
    print("functions by own time, ms per episode:")
    for key, value in sorted(raw.items(), key=lambda kv: -kv[1][2])[: args.top]:
        where = f"{Path(key[0]).name}:{key[1]}({key[2]})"
        print(f"  {1000 * value[2] / done:7.3f}  {value[1]:>8} calls  {where}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="per case and round")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=30, help="functions the profile lists")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from areal.plugins.models.tiny import init_tiny

    with tempfile.TemporaryDirectory(prefix="areal-bench-episode-") as tmp:
        work = Path(tmp)
        model_dir = work / "nano"
        init_tiny(model_dir, size="nano", seed=0)
        source = ZmqTrajectorySource("tcp://127.0.0.1:*", queue_max_size=256)
        drain = Drain(source)
        drain.start()
        sink = ["--sink", "zmq", "--sink-address", source.address]
        env = {"AREAL_GATEWAY_KEY": GATEWAY_KEY, "AREAL_ADMIN_TOKEN": ADMIN_TOKEN}
        stub_port, port = pick_free_port(), pick_free_port()
        stub_url, url = f"http://127.0.0.1:{stub_port}", f"http://127.0.0.1:{port}"
        with contextlib.ExitStack() as stack:
            stub = stub_command(stub_port, model_dir, "incremental")
            stack.enter_context(server("stub", stub, f"{stub_url}/health", work))
            command = gateway_command(stub_url, port, work, None, extra=sink)
            proc = stack.enter_context(server("gateway", command, f"{url}/health", work, env))
            assert proc.pid is not None
            tallies = measure(url, proc.pid, args)
            if args.profile:
                profile(stub_url, sink, work, args)
        drain.stopping = True
        drain.join()
        source.close()
    chat_ms, episode_ms = tallies["chat"].cpu_ms(), tallies["episode"].cpu_ms()
    result = {
        "clients": args.clients,
        "chat_per_s": tallies["chat"].per_s(),
        "episodes_per_s": tallies["episode"].per_s(),
        "gateway_cpu_ms_per_chat": chat_ms,
        "gateway_cpu_ms_per_episode": episode_ms,
        "episode_vs_chat": episode_ms / chat_ms,
        "trajectories_taken": drain.taken,
    }
    print(f"\n{'case':<10} {'per s':>9} {'gateway CPU ms':>15}")
    print(f"{'chat':<10} {result['chat_per_s']:>9.0f} {chat_ms:>15.3f}")
    print(f"{'episode':<10} {result['episodes_per_s']:>9.0f} {episode_ms:>15.3f}")
    print(f"an episode costs the gateway {result['episode_vs_chat']:.2f}x a chat call's CPU")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
