"""Soak: N concurrent agent sessions for T minutes against a real gateway; does anything leak?

Run: ``.venv/bin/python bench/soak.py [--sessions 256] [--minutes 10] [--against gateway|train]
[--json PATH]``.

A **session** is what a rollout worker does for one episode: open an RL session with the admin
token (``POST /rl/sessions``, a long poll), make two chat calls with the official ``openai`` SDK
(async, no retries) under the session's own key (the second call carries the first answer as
history), then end the session with a reward (``POST /rl/sessions/{id}/end``), which hands its
trajectory to the trainer's queue. ``--sessions`` such loops run back to back for ``--minutes``,
their first sessions spread over ``--ramp`` seconds; at the end each finishes the session it is in.

Every server is a real process on 127.0.0.1:

- ``--against gateway`` (default): ``areal serve gateway --model M`` with its embedded engine
  (``areal serve inference``, the gateway's child), ``--sink zmq`` into a trajectory queue held
  by a **stand-in trainer** in this process: the trainer's own ``ZmqTrajectorySource`` with
  ``--queue-max-size``, drained by a thread. Every ``--trainer-pause-every`` seconds (60) it
  stops taking, like a long train step, until the queue is full, and holds it full for
  ``--trainer-pause`` seconds (5): the bound and the back-pressure behind it (each ``end`` waits
  for its trajectory's acknowledgement, the gateway holding the trajectory meanwhile) are
  exercised every minute rather than never.
- ``--against train``: ``areal serve gateway`` without an engine, and a real ``areal train`` run
  (the quickstart, shrunk: no warm start, ``--size`` model, unbounded steps) attached to it with
  ``agent.gateway_url``: the run's engine, trainer, queue and its own rollout worker
  (``agent.concurrency`` 8), and these sessions beside them, admitted by the run's staleness
  budget. The queue figure is the run's own ``trajectories_queued`` after each step
  (``metrics.jsonl``).

Every ``--sample`` seconds (10) the bench prints the sessions ended and their rate, chat-call
p50/p99, errors, the RSS and CPU of every process (the gateway, the engine(s), the trainer and
rollout worker where present, this load driver), the most items the queue held since the last
sample against its limit, the trajectories the gateway holds until the queue acknowledges them
(``delivering`` in ``GET /rl/sessions``) and the 1-minute load average. Targets (each printed
with pass/fail; the exit status is 1 when one is missed):

- **errors = 0**: any exception or error status on open, chat or end (a ``429`` after a long poll
  is the budget working: counted as a wait, and the session opens again);
- **gateway RSS growth ≤ 10 % after the first minute**: the largest sample after
  ``--baseline`` (60 s) over the sample at it (a run shorter than twice that: its second half);
- **engine RSS flat**: the same measure and limit, for each engine;
- **queue ≤ queue_max_size**: the queue's items at every sample (and, training, every step).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import aiohttp  # noqa: E402
import psutil  # noqa: E402
from load_monitor import LoadMonitor  # noqa: E402

from areal.host.process import ServerProcess, pick_free_port  # noqa: E402
from areal.run.gateway_client import GatewayAdmin, GatewayBusy  # noqa: E402

ADMIN_TOKEN = "soak-admin-token-0123456789"
GATEWAY_KEY = "soak-gateway-key-0123456789"
POLICY = "areal-soak"
ROUTER = f"model_routing:\n  policy_model:\n    model_id: {POLICY}\n    max_tokens: 1024\n"
MB = 1024 * 1024
LONG_POLL_S = 30.0
FILL_MAX_S = 60.0  # the stand-in trainer's pause waits at most this long for a full queue


@dataclasses.dataclass(frozen=True)
class Settings:
    sessions: int = 256  # concurrent session loops
    minutes: float = 10.0
    against: str = "gateway"  # or "train"
    size: str = "tiny"  # areal's tiny model family: nano, tiny, small
    tokens: int = 8  # max_tokens of each chat call
    sample: float = 10.0  # seconds between samples
    baseline: float = 60.0  # growth is measured against the sample at this time
    ramp: float = 5.0
    queue_max_size: int = 256  # the quickstart's async.queue_max_size
    trainer_pause: float = 5.0  # stand-in trainer: stop taking until the queue is full, then
    trainer_pause_every: float = 60.0  # hold it full this long; this often (0: never)
    growth_limit: float = 0.10


# --- the load ------------------------------------------------------------------------------------


class Record:
    """What the sessions did: latencies (seconds) by kind, with their end times, and errors."""

    KINDS = ("open", "chat", "end", "session")

    def __init__(self) -> None:
        self.times = {k: array("d") for k in self.KINDS}  # monotonic end time of each
        self.latency = {k: array("d") for k in self.KINDS}
        self.errors: list[tuple[float, str]] = []
        self.waits = 0  # opens answered 429 after their long poll (the budget was full)
        self.sent = 0  # ended sessions whose trajectory went to the queue

    def add(self, kind: str, started: float) -> None:
        now = time.monotonic()
        self.times[kind].append(now)
        self.latency[kind].append(now - started)

    def error(self, what: str) -> None:
        self.errors.append((time.monotonic(), what[:300]))

    def window(self, kind: str, start: float, end: float) -> list[float]:
        times, lat = self.times[kind], self.latency[kind]
        return [lat[i] for i in range(len(times)) if start <= times[i] < end]

    def count(self, kind: str, start: float, end: float) -> int:
        return sum(1 for t in self.times[kind] if start <= t < end)


class Load:
    """``sessions`` loops of open → chat → chat → end, on this process's event loop."""

    def __init__(self, gateway_url: str, s: Settings, record: Record) -> None:
        self.url, self.s, self.record = gateway_url, s, record
        self.stopping = asyncio.Event()

    async def run(self) -> None:
        import openai

        # the SDK's own limits type (its HTTP stack is not necessarily the httpx we have), with
        # a connection kept alive per session: its default keeps 100, so 256 loops would churn
        n = 2 * self.s.sessions
        limits = type(openai.DEFAULT_CONNECTION_LIMITS)(
            max_connections=n, max_keepalive_connections=n
        )
        http = openai.DefaultAsyncHttpxClient(limits=limits)
        base = openai.AsyncOpenAI(
            base_url=self.url + "/v1",
            api_key=GATEWAY_KEY,
            max_retries=0,  # a retry would be recorded as another turn, and would hide errors
            timeout=300.0,
            http_client=http,
        )
        connector = aiohttp.TCPConnector(limit=2 * self.s.sessions)
        timeout = aiohttp.ClientTimeout(total=LONG_POLL_S + 300.0)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            admin = GatewayAdmin(self.url, ADMIN_TOKEN, http=session)
            loops = [self._loop(i, admin, base) for i in range(self.s.sessions)]
            await asyncio.gather(*loops)
        await http.aclose()

    async def _loop(self, i: int, admin: GatewayAdmin, base: Any) -> None:
        rng = random.Random(i)
        await asyncio.sleep(i * self.s.ramp / self.s.sessions)
        n = 0
        while not self.stopping.is_set():
            await self._session(f"{i}-{n}", rng, admin, base)
            n += 1

    async def _session(self, name: str, rng: random.Random, admin: GatewayAdmin, base: Any) -> None:
        record = self.record
        started = time.monotonic()
        sid = None
        step = "open"
        try:
            while True:
                t = time.monotonic()
                try:
                    opened = await admin.open_session(
                        metadata={"soak": name}, task_id=name, wait_s=LONG_POLL_S
                    )
                    break
                except GatewayBusy:
                    record.waits += 1  # the budget stayed full for the whole long poll
            record.add("open", t)
            sid = opened["session_id"]
            client = base.with_options(api_key=opened["api_key"])
            messages: list[dict[str, str]] = [
                {"role": "user", "content": f"Session {name}: name a colour."}
            ]
            for turn in range(2):
                step = f"chat {turn + 1}"
                t = time.monotonic()
                answer = await client.chat.completions.create(
                    model=POLICY,
                    messages=messages,
                    max_tokens=self.s.tokens,
                    temperature=1.0,
                )
                record.add("chat", t)
                messages += [
                    {"role": "assistant", "content": answer.choices[0].message.content or ""},
                    {"role": "user", "content": "And another one?"},
                ]
            step = "end"
            t = time.monotonic()
            ended = await admin.end(sid, reward=rng.random())
            record.add("end", t)
            record.sent += bool(ended.get("sent"))
            record.add("session", started)
        except Exception as err:  # every failure counts; the loop goes on with a new session
            record.error(f"{step}: {type(err).__name__}: {err}")
            if sid is not None and step != "end":
                try:
                    await admin.end(sid, discard=True)
                except Exception as again:
                    record.error(f"discard after a failure: {type(again).__name__}: {again}")
            await asyncio.sleep(0.1)


# --- the stand-in trainer (--against gateway) ----------------------------------------------------


class StandInTrainer(threading.Thread):
    """The trainer's end of the queue: the real ``ZmqTrajectorySource`` (at most
    ``queue_max_size`` trajectories), drained by this thread with a pause now and then."""

    def __init__(self, s: Settings) -> None:
        super().__init__(daemon=True, name="soak-trainer")
        from areal.plugins.queues.zmq_queue import ZmqTrajectorySource

        self.s = s
        self.source = ZmqTrajectorySource("tcp://127.0.0.1:*", queue_max_size=s.queue_max_size)
        self.taken = 0
        self.samples = 0
        self.tokens = 0  # in the trajectories taken (prompt and output)
        self.pauses = 0
        self.full_at_pause: list[int] = []  # what the queue held when each pause began its hold
        self.peak = 0  # the most trajectories the queue held since the last sample took it
        self._stop_event = threading.Event()

    def take_peak(self) -> int:
        peak, self.peak = max(self.peak, self.source.buffered), 0
        return peak

    def stop(self) -> None:
        self._stop_event.set()
        self.join(30)
        self.source.close()

    def run(self) -> None:
        every, hold = self.s.trainer_pause_every, self.s.trainer_pause
        next_pause = time.monotonic() + every
        while not self._stop_event.is_set():
            if every > 0 and time.monotonic() >= next_pause:
                self._pause(hold)
                next_pause = time.monotonic() + every
            self.peak = max(self.peak, self.source.buffered)
            trajectory = self.source.get(timeout=0.25)
            if trajectory is None:
                continue
            self.taken += 1
            self.samples += len(trajectory.samples)
            self.tokens += sum(len(x.input_ids) for x in trajectory.samples)

    def _pause(self, hold: float) -> None:
        """Take nothing until the queue is full (at most ``FILL_MAX_S``), then ``hold`` seconds
        more: the producers' ``put`` waits for an acknowledgement that does not come yet."""
        self.pauses += 1
        deadline = time.monotonic() + FILL_MAX_S
        while self.source.buffered < self.s.queue_max_size and time.monotonic() < deadline:
            if self._stop_event.wait(0.05):
                return
        self.full_at_pause.append(self.source.buffered)
        self.peak = max(self.peak, self.source.buffered)
        self._stop_event.wait(hold)
        self.peak = max(self.peak, self.source.buffered)


# --- the processes -------------------------------------------------------------------------------


def start_gateway(root: Path, s: Settings, extra: list[str]) -> tuple[ServerProcess, str]:
    config = root / "router.yaml"
    config.write_text(ROUTER)
    port = pick_free_port()
    command = [sys.executable, "-m", "areal", "serve", "gateway", "--config", str(config)]
    command += ["--port", str(port), "--log-dir", str(root / "gateway"), "--log-level", "warning"]
    # one torch thread in the embedded engine: the 2 cores are shared by every process here
    env = {"AREAL_ADMIN_TOKEN": ADMIN_TOKEN, "AREAL_GATEWAY_KEY": GATEWAY_KEY}
    env["OMP_NUM_THREADS"] = "1"
    gateway = ServerProcess(command + extra, log_path=root / "gateway.log", env=env, name="gateway")
    url = f"http://127.0.0.1:{port}"
    gateway.start().wait_healthy(url, timeout=240)
    return gateway, url


def start_training(root: Path, s: Settings, gateway_url: str) -> subprocess.Popen[bytes]:
    """``areal train`` on the quickstart, shrunk, attached to the gateway at ``gateway_url``."""
    out, logs = root / "train", root / "train" / "logs"
    command = [sys.executable, "-m", "areal", "train", str(ROOT / "configs" / "quickstart.yaml")]
    command += ["--output-dir", str(out)]
    for override in (
        f"agent.gateway_url={gateway_url}",
        f"model.path={root / 'model'}",
        f"model.init_tiny={s.size}",
        "warm_start.steps=0",
        "train.max_steps=1000000",  # stopped by SIGTERM once the soak is over
        f"logging.log_dir={logs}",
        "logging.save_interval=1000000",
        "agent.concurrency=8",
        f"async.queue_max_size={s.queue_max_size}",
    ):
        command += ["--set", override]
    env = {**os.environ, "AREAL_ADMIN_TOKEN": ADMIN_TOKEN, "AREAL_GATEWAY_KEY": GATEWAY_KEY}
    env["OMP_NUM_THREADS"] = "1"
    log = open(root / "train.log", "ab")  # noqa: SIM115 (the child holds it)
    return subprocess.Popen(command, env=env, cwd=root, stdout=log, stderr=subprocess.STDOUT)


def admin_get(url: str, path: str) -> Any:
    request = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=30) as answer:
        return json.load(answer)


def wait_for_run(gateway_url: str, train: subprocess.Popen[bytes], timeout: float = 600) -> None:
    """Until the run holds the gateway's trainer seat and its engine takes calls."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if train.poll() is not None:
            raise RuntimeError(f"areal train exited with {train.returncode} before it attached")
        seat = admin_get(gateway_url, "/rl/trainer").get("trainer")
        engines = admin_get(gateway_url, "/rl/engines").get("engines") or []
        if seat and any(e.get("healthy") for e in engines):
            return
        time.sleep(1.0)
    raise RuntimeError("the training run did not attach to the gateway in time")


def processes(named: dict[str, int]) -> dict[str, psutil.Process]:
    """Every process of the soak by role: ``named`` roots and their descendants, the engines,
    rollout workers and trainer ranks recognised by their command lines."""
    found: dict[str, psutil.Process] = {}
    seen: set[int] = set(named.values())
    for role, pid in named.items():
        try:
            root = psutil.Process(pid)
        except psutil.Error:
            continue
        found[role] = root
        for child in root.children(recursive=True):
            if child.pid in seen:
                continue
            seen.add(child.pid)
            try:
                line = " ".join(child.cmdline())
            except psutil.Error:
                continue
            if "serve inference" in line or "embedded.server" in line:
                kind = "engine"
            elif "rollout_worker" in line:
                kind = "rollout"
            elif "areal.gateway.server" in line:
                kind = "gateway"
            else:
                kind = f"{role}-child"
            label, k = kind, 1
            while label in found:
                k += 1
                label = f"{kind}{k}"
            found[label] = child
    return found


# --- sampling ------------------------------------------------------------------------------------


class Sampler:
    """One row every ``s.sample`` seconds: rate, latency, errors, RSS/CPU per process, queue."""

    def __init__(
        self,
        s: Settings,
        record: Record,
        roots: dict[str, int],
        queue: Callable[[], tuple[int | None, int | None]],
        gateway_url: str,
    ) -> None:
        self.s, self.record, self.roots, self.queue = s, record, roots, queue
        self.gateway_url = gateway_url
        self.rows: list[dict[str, Any]] = []
        self.t0 = time.monotonic()
        self._cpu: dict[int, float] = {}
        self._last = self.t0

    def take(self, listing: dict[str, Any]) -> dict[str, Any]:
        now = time.monotonic()
        start, record = self._last, self.record
        rss, cpu = {}, {}
        for role, proc in processes(self.roots).items():
            try:
                with proc.oneshot():
                    rss[role] = proc.memory_info().rss / MB
                    t = proc.cpu_times()
            except psutil.Error:
                continue
            used = t.user + t.system
            cpu[role] = (used - self._cpu.get(proc.pid, used)) / max(1e-9, now - start)
            self._cpu[proc.pid] = used
        chat = record.window("chat", start, now)
        items, limit = self.queue()
        row = {
            "t": round(now - self.t0, 1),
            "sessions": record.count("session", self.t0, now),
            "sessions_per_s": record.count("session", start, now) / max(1e-9, now - start),
            "chat_p50_ms": 1000 * quantile(chat, 0.5),
            "chat_p99_ms": 1000 * quantile(chat, 0.99),
            "errors": len(record.errors),
            "waits": record.waits,
            "rss_mb": rss,
            "cpu_cores": cpu,
            "queue_items": items,
            "queue_limit": limit,
            "gateway_open": len(listing.get("open") or []),
            "gateway_delivering": listing.get("delivering"),
            "loadavg_1m": os.getloadavg()[0],
        }
        self._last = now
        self.rows.append(row)
        print(row_line(row), flush=True)
        return row

    async def run(self, until: float) -> None:
        while True:
            listing = await asyncio.to_thread(admin_get, self.gateway_url, "/rl/sessions")
            self.take(listing)
            if time.monotonic() - self.t0 >= until - 1e-3:
                return
            next_at = self.t0 + self.s.sample * len(self.rows)
            await asyncio.sleep(max(0.0, min(next_at, self.t0 + until) - time.monotonic()))


def quantile(values: list[float] | array[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def row_line(r: dict[str, Any]) -> str:
    mem = " ".join(f"{k} {v:.0f}" for k, v in r["rss_mb"].items())
    queue = "-" if r["queue_items"] is None else f"{r['queue_items']}/{r['queue_limit']}"
    return (
        f"t={r['t']:6.1f}s sessions {r['sessions']:>7,} ({r['sessions_per_s']:6.1f}/s) "
        f"chat p50 {r['chat_p50_ms']:6.1f} ms p99 {r['chat_p99_ms']:7.1f} ms errors "
        f"{r['errors']} | RSS MB: {mem} | queue {queue}, gateway holds "
        f"{r['gateway_delivering']} | load {r['loadavg_1m']:.2f}"
    )


# --- one run -------------------------------------------------------------------------------------


def measure(root: Path, s: Settings) -> dict[str, Any]:
    from areal.plugins.models.tiny import init_tiny

    model = root / "model"
    init_tiny(model, size=s.size, seed=0)
    record = Record()
    monitor = LoadMonitor()
    monitor.start()
    trainer: StandInTrainer | None = None
    train: subprocess.Popen[bytes] | None = None
    queue_events: list[int] = []
    if s.against == "gateway":
        trainer = StandInTrainer(s)
        sink = ["--sink", "zmq", "--sink-address", trainer.source.address]
        gateway, url = start_gateway(root, s, ["--model", str(model), *sink])
        roots = {"gateway": gateway.pid or 0, "driver": os.getpid()}
        stand_in = trainer

        def queue() -> tuple[int | None, int | None]:
            return stand_in.take_peak(), s.queue_max_size

        trainer.start()
    else:
        gateway, url = start_gateway(root, s, [])
        train = start_training(root, s, url)
        metrics = root / "train" / "logs" / "metrics.jsonl"
        roots = {"gateway": gateway.pid or 0, "trainer": train.pid, "driver": os.getpid()}

        def queue() -> tuple[int | None, int | None]:
            queue_events[:] = queued_by_step(metrics)
            return (queue_events[-1] if queue_events else None), s.queue_max_size

    try:
        if train is not None:
            wait_for_run(url, train)
        load = Load(url, s, record)
        sampler = Sampler(s, record, roots, queue, url)
        seconds = 60.0 * s.minutes

        async def soak() -> float:
            running = asyncio.create_task(load.run())
            with monitor.measuring("soak"):
                await sampler.run(seconds)
            load.stopping.set()
            ended = time.monotonic()
            await asyncio.wait_for(running, timeout=600)
            return time.monotonic() - ended

        finishing = asyncio.run(soak())
        if trainer is not None:  # the last trajectories reach the queue
            deadline = time.monotonic() + 30
            while trainer.taken < record.sent and time.monotonic() < deadline:
                time.sleep(0.1)
    finally:
        if train is not None and train.poll() is None:
            train.send_signal(signal.SIGTERM)
            try:
                train.wait(timeout=180)
            except subprocess.TimeoutExpired:
                train.kill()
        gateway.stop(timeout=60)
        if trainer is not None:
            trainer.stop()
        monitor.stop()
    if train is not None:
        queue_events[:] = queued_by_step(root / "train" / "logs" / "metrics.jsonl")
    return results(s, record, sampler, monitor, trainer, queue_events, finishing, seconds)


def queued_by_step(metrics: Path) -> list[int]:
    """The run's ``trajectories_queued`` after each step so far."""
    if not metrics.exists():
        return []
    out = []
    for line in metrics.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        if event.get("event") == "accounting" and "trajectories_queued" in event:
            out.append(int(event["trajectories_queued"]))
    return out


def growth(rows: list[dict[str, Any]], role: str, baseline: float) -> dict[str, float] | None:
    """RSS at ``baseline`` seconds, at the end, the largest after it, and that over the base."""
    have = [r for r in rows if role in r["rss_mb"]]
    if not have:
        return None
    base = next((r for r in have if r["t"] >= baseline - 1e-3), have[-1])
    after = [r["rss_mb"][role] for r in have if r["t"] > base["t"]] or [base["rss_mb"][role]]
    start = base["rss_mb"][role]
    return {
        "start_mb": have[0]["rss_mb"][role],
        "baseline_mb": start,
        "baseline_t": base["t"],
        "end_mb": have[-1]["rss_mb"][role],
        "max_after_mb": max(after),
        "growth": max(after) / start - 1.0,
    }


def within(m: dict[str, float] | None, limit: float) -> bool:
    return m is not None and m["growth"] <= limit


def results(
    s: Settings,
    record: Record,
    sampler: Sampler,
    monitor: LoadMonitor,
    trainer: StandInTrainer | None,
    queue_events: list[int],
    finishing: float,
    seconds: float,
) -> dict[str, Any]:
    rows = sampler.rows
    t0 = sampler.t0
    baseline = min(s.baseline, seconds / 2)  # a short run: its second half
    roles = sorted({k for r in rows for k in r["rss_mb"]}, key=lambda k: (k != "gateway", k))
    memory = {role: growth(rows, role, baseline) for role in roles}
    engines = [r for r in roles if r.startswith("engine")]
    items = [r["queue_items"] for r in rows if r["queue_items"] is not None] + queue_events
    if trainer is not None:  # what it held as each pause began holding it full
        items += trainer.full_at_pause
    queue_max = max(items) if items else None
    delivering = [r["gateway_delivering"] or 0 for r in rows]
    sessions = record.count("session", t0, t0 + seconds)
    chat = record.latency["chat"]
    targets = {
        "errors == 0": len(record.errors) == 0,
        f"gateway RSS growth after {baseline:g}s <= {s.growth_limit:.0%}": within(
            memory.get("gateway"), s.growth_limit
        ),
        f"engine RSS growth after {baseline:g}s <= {s.growth_limit:.0%} (flat)": bool(engines)
        and all(within(memory[e], s.growth_limit) for e in engines),
        "queue items <= queue_max_size at every sample": queue_max is not None
        and queue_max <= s.queue_max_size,
    }
    out: dict[str, Any] = {
        "settings": dataclasses.asdict(s),
        "seconds": seconds,
        "baseline_s": baseline,
        "sessions": sessions,
        "sessions_per_s": sessions / seconds,
        "sessions_total": len(record.times["session"]),
        "finishing_s": finishing,
        "calls": record.count("chat", t0, t0 + seconds),
        "calls_total": len(chat),
        "latency_ms": {
            kind: {
                "p50": 1000 * quantile(record.latency[kind], 0.5),
                "p99": 1000 * quantile(record.latency[kind], 0.99),
            }
            for kind in Record.KINDS
        },
        "errors": len(record.errors),
        "first_errors": [e[1] for e in record.errors[:5]],
        "budget_waits": record.waits,
        "memory": memory,
        "queue_max": queue_max,
        "queue_max_size": s.queue_max_size,
        "gateway_delivering_max": max(delivering),
        "gateway_open_max": max(r["gateway_open"] for r in rows),
        "loadavg_1m_mean": sum(r["loadavg_1m"] for r in rows) / len(rows),
        "loadavg_1m_max": max(r["loadavg_1m"] for r in rows),
        "other_load_cores": monitor.other_cores("soak"),
        "cpu_cores_mean": {
            role: sum(r["cpu_cores"].get(role, 0.0) for r in rows[1:]) / max(1, len(rows) - 1)
            for role in roles
        },
        "samples": rows,
        "targets": targets,
        "met": all(targets.values()),
    }
    if trainer is not None:
        out["trajectories_sent"] = record.sent
        out["trajectories_taken"] = trainer.taken
        out["trainer_pauses"] = trainer.pauses
        out["queue_at_pause"] = trainer.full_at_pause
        out["tokens_per_trajectory"] = trainer.tokens / trainer.taken if trainer.taken else 0.0
    return out


# --- the report ----------------------------------------------------------------------------------


def report(res: dict[str, Any]) -> str:
    s = res["settings"]
    lat = res["latency_ms"]
    lines = [
        f"soak against {s['against']}: {s['sessions']} concurrent sessions (open, 2 chat calls "
        f"of <= {s['tokens']} tokens, end with a reward) for {res['seconds'] / 60:g} min, "
        f"`{s['size']}` model",
        f"sessions {res['sessions']:,} ({res['sessions_per_s']:.1f}/s), chat calls "
        f"{res['calls']:,}, errors {res['errors']}, budget waits {res['budget_waits']} "
        f"(+{res['sessions_total'] - res['sessions']} sessions finished in the "
        f"{res['finishing_s']:.1f}s after the end)",
        "latency ms   "
        + "  ".join(f"{k} p50 {v['p50']:.1f} p99 {v['p99']:.1f}" for k, v in lat.items()),
        f"{'RSS MB':<12}{'start':>8}{'@' + format(res['baseline_s'], 'g') + 's':>8}{'end':>8}"
        f"{'max after':>11}"
        f"{'growth':>9}{'cores':>7}",
    ]
    for role, m in res["memory"].items():
        if m is None:
            continue
        lines.append(
            f"{role:<12}{m['start_mb']:>8.0f}{m['baseline_mb']:>8.0f}{m['end_mb']:>8.0f}"
            f"{m['max_after_mb']:>11.0f}{m['growth']:>+9.1%}{res['cpu_cores_mean'][role]:>7.2f}"
        )
    queue = (
        f"queue: max {res['queue_max']} items of queue_max_size {res['queue_max_size']}; the "
        f"gateway held at most {res['gateway_delivering_max']} trajectories waiting for it, "
        f"{res['gateway_open_max']} sessions open"
    )
    if "trajectories_taken" in res:
        queue += (
            f"\n  trajectories of {res['tokens_per_trajectory']:.0f} tokens: sent "
            f"{res['trajectories_sent']:,}, taken by the trainer {res['trajectories_taken']:,}, "
            f"trainer pauses {res['trainer_pauses']} (the queue held "
            f"{', '.join(map(str, res['queue_at_pause'])) or '-'} as each began its hold)"
        )
    lines.append(queue)
    lines.append(
        f"machine: load average (1 min) mean {res['loadavg_1m_mean']:.2f}, max "
        f"{res['loadavg_1m_max']:.2f}; other processes used {res['other_load_cores']:.2f} cores"
    )
    for name, ok in res["targets"].items():
        lines.append(f"  [{'pass' if ok else 'FAIL'}] {name}")
    lines.append("all targets met" if res["met"] else "some targets missed")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    d = Settings()
    parser.add_argument("--sessions", type=int, default=d.sessions)
    parser.add_argument("--minutes", type=float, default=d.minutes)
    parser.add_argument("--against", choices=["gateway", "train"], default=d.against)
    parser.add_argument("--size", choices=["nano", "tiny", "small"], default=d.size)
    parser.add_argument("--tokens", type=int, default=d.tokens)
    parser.add_argument("--sample", type=float, default=d.sample)
    parser.add_argument("--baseline", type=float, default=d.baseline)
    parser.add_argument("--ramp", type=float, default=d.ramp)
    parser.add_argument("--queue-max-size", type=int, default=d.queue_max_size)
    parser.add_argument("--trainer-pause", type=float, default=d.trainer_pause)
    parser.add_argument("--trainer-pause-every", type=float, default=d.trainer_pause_every)
    parser.add_argument("--json", type=Path, help="also write the figures (and every sample) here")
    parser.add_argument(
        "--workdir",
        type=Path,
        help="keep the model and every process's logs here (default: a "
        "temporary directory, removed after)",
    )
    args = parser.parse_args(argv)
    s = Settings(
        sessions=args.sessions,
        minutes=args.minutes,
        against=args.against,
        size=args.size,
        tokens=args.tokens,
        sample=args.sample,
        baseline=args.baseline,
        ramp=args.ramp,
        queue_max_size=args.queue_max_size,
        trainer_pause=args.trainer_pause,
        trainer_pause_every=args.trainer_pause_every,
    )
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        res = measure(args.workdir.resolve(), s)
    else:
        with tempfile.TemporaryDirectory(prefix="areal-soak-") as tmp:
            res = measure(Path(tmp), s)
    print(report(res))
    if res["first_errors"]:
        print("first errors:", *res["first_errors"], sep="\n  ")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    return 0 if res["met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
