"""The gateway's own cost, against an instant stub engine, with LiteLLM's proxy as the peer.

Run: ``make bench-gateway`` (installs LiteLLM's proxy into ``.venv/litellm`` first), or
``.venv/bin/python bench/gateway.py [--json] [--profile]``.

Every server is a real process on 127.0.0.1: the stub engine (``bench/stub_engine.py``, which
answers 8 fixed tokens the moment it has read a request), the areal gateway
(``python -m areal.gateway.server --engine <stub>``) and, if installed, a LiteLLM proxy forwarding
to the stub's OpenAI-compatible route. What the table shows:

- p50/p99 of a short OpenAI chat request (system + user turn, ``max_tokens`` 8), sent one after
  another on a kept-alive connection, plain and streamed (time to the last byte);
- "added": the p50 through the proxy minus the p50 of the same call straight to its backend. The
  gateway's backend call is the stub's ``/generate`` (SGLang's API: the gateway renders the chat
  template and tokenizes), LiteLLM's is the stub's ``/v1/chat/completions``;
- requests/s with 64 concurrent clients, bounded by a request count and a duration;
- a streamed request by its length (64, 512 and 4,096 tokens; ``--no-lengths`` skips it): the
  bytes the engine sent and the gateway's CPU per request, when the engine streams cumulative
  chunks (SGLang's default) and incremental ones (the embedded engine's). Each chunking has its
  own stub and gateway; the streamed short request is measured against both too.

Cases alternate round by round, so slow phases of this shared machine hit all of them alike.
``--profile`` then runs one more gateway under cProfile and says where its CPU time goes.

LiteLLM runs from a venv of its own (``.venv/litellm``; ``--litellm PATH`` or one on ``$PATH``
also do): installed into the project's venv, ``litellm[proxy]`` would downgrade
huggingface_hub, rich and websockets there. Without it, its rows are skipped with a note.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pstats
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from areal.host.process import ServerProcess, pick_free_port

ROOT = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")
GATEWAY_KEY = "bench-gateway-key-0123456789"
LITELLM_KEY = "sk-bench-litellm-0123456789"
MODEL = "areal-bench"
MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name one primary colour, in one word."},
]
MAX_TOKENS = 8
STREAM_LENGTHS = (64, 512, 4096)  # tokens per streamed request, for the cost-by-length table
TOKENS_PER_CASE = 4096  # per length, chunking and round: 64 streams of 64 tokens ... 1 of 4096
CHUNKINGS = ("cumulative", "incremental")  # before and after: the engine's stream chunks
TARGET_ADDED_MS = 1.5
TARGET_RPS = 1000.0
LITELLM_INSTALL = "python3 -m venv .venv/litellm && .venv/litellm/bin/pip install 'litellm[proxy]'"


class BenchError(RuntimeError):
    """A case answered something other than 200."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body.decode("utf-8", errors="replace")[:300]
        super().__init__(f"HTTP {status}: {self.body}")


@dataclass
class Case:
    """One way of getting a chat answer: an endpoint and the bodies to send it."""

    name: str
    url: str
    headers: dict[str, str]
    body: dict[str, Any]
    stream: bool
    baseline: str | None = None  # the direct case this one's added latency is measured against
    peer: str | None = None  # the LiteLLM case to compare with
    samples: list[float] = field(default_factory=list)  # seconds
    rps: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)  # the proxy's CPU per request under load
    pid: int | None = None  # the proxy's process, whose CPU time is read from /proc
    errors: int = 0
    skipped: str | None = None

    @property
    def payload(self) -> bytes:
        return json.dumps({**self.body, **({"stream": True} if self.stream else {})}).encode()


@dataclass
class Row:
    case: str
    p50_ms: float | None
    p99_ms: float | None
    added_p50_ms: float | None
    rps_at_64: float | None
    rps_vs_litellm: float | None
    added_vs_litellm: float | None
    cpu_ms_per_request: float | None = None
    note: str = ""


# --- measurement ---------------------------------------------------------------------------------


async def one(session: aiohttp.ClientSession, case: Case, payload: bytes) -> float:
    """Seconds from sending the request to its last byte."""
    started = time.perf_counter()
    async with session.post(case.url, data=payload, headers=case.headers) as resp:
        body = await resp.read()
        if resp.status != 200:
            raise BenchError(resp.status, body)
    return time.perf_counter() - started


async def sequential(session: aiohttp.ClientSession, case: Case, n: int) -> list[float]:
    payload = case.payload
    return [await one(session, case, payload) for _ in range(n)]


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` and every process below it, from /proc."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rpartition(")")[2].split()
            parents[int(stat.parent.name)] = int(fields[1])
            times[int(stat.parent.name)] = (int(fields[11]) + int(fields[12])) / TICKS
    mine, grew = {pid}, True
    while grew:
        below = {p for p, parent in parents.items() if parent in mine} - mine
        mine |= below
        grew = bool(below)
    return sum(times.get(p, 0.0) for p in mine)


async def under_load(
    case: Case, concurrency: int, max_requests: int, max_seconds: float
) -> tuple[float, int]:
    """Requests/s of ``concurrency`` clients, each sending its next request when one returns,
    and how many completed."""
    payload = case.payload
    issued = completed = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=max(60.0, max_seconds))
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.perf_counter()
        deadline = started + max_seconds

        async def client() -> None:
            nonlocal issued, completed
            while issued < max_requests and time.perf_counter() < deadline:
                issued += 1
                try:
                    await one(session, case, payload)
                    completed += 1
                except (TimeoutError, BenchError, aiohttp.ClientError):
                    case.errors += 1

        await asyncio.gather(*(client() for _ in range(concurrency)))
        return completed / (time.perf_counter() - started), completed


async def probe(session: aiohttp.ClientSession, case: Case) -> None:
    """One request that must succeed (with the protocol's shape) before a case is measured."""
    try:
        async with session.post(case.url, data=case.payload, headers=case.headers) as resp:
            body = await resp.read()
            status = resp.status
    except (TimeoutError, aiohttp.ClientError) as err:
        case.skipped = f"no answer: {type(err).__name__}: {err}"
        return
    if status == 404:
        case.skipped = "endpoint missing (404): the handler is not there yet"
    elif status != 200:
        case.skipped = f"HTTP {status}: {body.decode('utf-8', errors='replace')[:200]}"
    elif case.stream and b"[DONE]" not in body:
        case.skipped = "the stream did not end with data: [DONE]"
    elif not case.stream and b'"choices"' not in body and b'"output_ids"' not in body:
        case.skipped = f"unexpected answer: {body[:200]!r}"


async def measure(cases: list[Case], args: argparse.Namespace) -> None:
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for case in cases:
            await probe(session, case)
            if case.skipped is None:
                await sequential(session, case, args.warmup)
        live = [c for c in cases if c.skipped is None]
        for r in range(args.rounds):
            for case in live:
                case.samples += await sequential(session, case, args.requests)
                before = cpu_seconds(case.pid) if case.pid else 0.0
                rps, completed = await under_load(
                    case, args.concurrency, args.load_requests, args.load_seconds
                )
                case.rps.append(rps)
                if case.pid and completed:
                    case.cpu_ms.append(1000 * (cpu_seconds(case.pid) - before) / completed)
            print(f"  round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)


def p50_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def p99_ms(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[98] * 1000


def rows_of(cases: list[Case]) -> list[Row]:
    by_name = {c.name: c for c in cases}

    def ok(name: str | None) -> Case | None:
        case = by_name.get(name) if name else None
        return case if case is not None and case.skipped is None and case.samples else None

    def added(case: Case) -> float | None:
        base = ok(case.baseline)
        return p50_ms(case.samples) - p50_ms(base.samples) if base else None

    rows = []
    for case in cases:
        if ok(case.name) is None:
            skipped = Row(case.name, None, None, None, None, None, None, note=case.skipped or "")
            rows.append(skipped)
            continue
        rps = statistics.median(case.rps)
        peer = ok(case.peer)
        rps_ratio = added_ratio = None
        mine = added(case)
        if peer is not None:
            rps_ratio = rps / statistics.median(peer.rps)
            theirs = added(peer)
            if mine is not None and theirs is not None and mine > 0:
                added_ratio = theirs / mine
        note = f"{case.errors} errors under load" if case.errors else ""
        rows.append(
            Row(
                case.name,
                p50_ms(case.samples),
                p99_ms(case.samples),
                mine,
                rps,
                rps_ratio,
                added_ratio,
                statistics.median(case.cpu_ms) if case.cpu_ms else None,
                note,
            )
        )
    return rows


# --- servers -------------------------------------------------------------------------------------


def wait_ready(proc: ServerProcess, url: str, timeout: float) -> None:
    """Poll ``url`` until it answers 200 (or fail with the server's log tail)."""
    deadline = time.monotonic() + timeout
    while True:
        if not proc.running:
            raise RuntimeError(f"{proc.name} exited before {url} answered:\n{proc.log_tail()}")
        with (
            contextlib.suppress(urllib.error.URLError, OSError),
            urllib.request.urlopen(url, timeout=2) as resp,
        ):
            if resp.status == 200:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} was not ready after {timeout:g}s:\n{proc.log_tail()}")
        time.sleep(0.2)


@contextlib.contextmanager
def server(
    name: str,
    command: list[str],
    health: str,
    logs: Path,
    env: dict[str, str] | None = None,
    timeout: float = 120.0,
) -> Iterator[ServerProcess]:
    proc = ServerProcess(command, log_path=logs / f"{name}.log", env=env or {}, name=name)
    with proc:
        wait_ready(proc, health, timeout)
        yield proc


def gateway_command(
    stub_url: str,
    port: int,
    work: Path,
    profile_to: Path | None,
    name: str = "router",
    extra: list[str] | None = None,
) -> list[str]:
    """``python -m areal.gateway.server`` in front of ``stub_url`` (``extra``: more flags), or
    the same gateway under cProfile when ``profile_to`` is set (see ``serve_profiled``)."""
    router = work / f"{name}.yaml"
    router.write_text(
        f"model_routing:\n  policy_model:\n    model_id: {MODEL}\n"
        f"    max_tokens: {max(STREAM_LENGTHS)}\n"
    )
    args = [
        "--config",
        str(router),
        "--engine",
        stub_url,
        "--port",
        str(port),
        "--log-dir",
        str(work / f"{name}-logs"),
        "--log-level",
        "warning",
        *(extra or []),
    ]
    if profile_to is None:
        return [sys.executable, "-m", "areal.gateway.server", *args]
    return [sys.executable, __file__, "--profiled-gateway", str(profile_to), "--", *args]


def serve_profiled(out: str, server_args: list[str]) -> int:
    """The gateway as ``python -m areal.gateway.server`` runs it, with a profiler that SIGUSR1
    starts and SIGUSR2 stops and saves, so start-up and shutdown stay out of the figures."""
    import cProfile

    from areal.gateway.server import main as gateway_main

    profiler = cProfile.Profile(
        time.process_time
    )  # CPU time: a busy machine's preemption is not charged

    def stop(*_: object) -> None:
        profiler.disable()
        profiler.dump_stats(out + ".part")
        os.replace(out + ".part", out)  # whole or absent, never half-written

    signal.signal(signal.SIGUSR1, lambda *_: profiler.enable())
    signal.signal(signal.SIGUSR2, stop)
    return gateway_main(server_args)


def profile_while(pid: int, out: Path, drive: Callable[[], Any]) -> Any:
    """``drive()`` with the profiled gateway ``pid`` (``serve_profiled``) recording, then its
    profile saved to ``out`` (waited for, up to 30 s); what ``drive`` returned."""
    os.kill(pid, signal.SIGUSR1)
    try:
        return drive()
    finally:
        os.kill(pid, signal.SIGUSR2)
        deadline = time.monotonic() + 30
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.1)


def find_litellm(explicit: str | None) -> str | None:
    for candidate in (explicit, str(ROOT / ".venv/litellm/bin/litellm"), shutil.which("litellm")):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def litellm_command(binary: str, stub_url: str, port: int, work: Path) -> list[str]:
    config = work / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: {stub_url}/v1\n"
        "      api_key: stub-key\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
        "general_settings:\n"
        f"  master_key: {LITELLM_KEY}\n"
    )
    return [binary, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]


LITELLM_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no download of the price list at start-up
    "LITELLM_LOG": "ERROR",
    "LITELLM_TELEMETRY": "False",
    "NO_DOCS": "True",
}


# --- the run -------------------------------------------------------------------------------------


def build_cases(
    stub: str, gateway: str, litellm: str | None, cumulative: tuple[str, str] | None = None
) -> list[Case]:
    """The chat cases; ``cumulative`` (a stub and a gateway in front of it) adds the streamed
    gateway case against an engine that sends cumulative chunks, the cost this bench compares."""
    chat = {"model": MODEL, "messages": MESSAGES, "max_tokens": MAX_TOKENS}
    gw_headers = {"Authorization": f"Bearer {GATEWAY_KEY}"}
    lite_headers = {"Authorization": f"Bearer {LITELLM_KEY}"}
    # A prompt of the length the gateway renders for MESSAGES (the stub ignores its content).
    generate = {
        "input_ids": list(range(10, 40)),
        "sampling_params": {"max_new_tokens": MAX_TOKENS},
        "return_logprob": True,
    }
    cases: list[Case] = []
    for stream in (False, True):
        kind = "stream" if stream else "plain"
        direct = f"stub /generate, direct ({kind})"
        gateway_case = f"areal gateway ({kind})"
        direct_chat = f"stub /v1/chat/completions, direct ({kind})"
        lite = f"LiteLLM proxy ({kind})"
        cases.append(Case(direct, f"{stub}/generate", {}, generate, stream))
        cases.append(
            Case(
                gateway_case,
                f"{gateway}/v1/chat/completions",
                gw_headers,
                chat,
                stream,
                baseline=direct,
                peer=lite if litellm else None,
            )
        )
        if stream and cumulative is not None:
            direct_cumulative = "stub /generate, direct (stream, cumulative chunks)"
            cases.append(Case(direct_cumulative, f"{cumulative[0]}/generate", {}, generate, True))
            cases.append(
                Case(
                    "areal gateway (stream, cumulative chunks)",
                    f"{cumulative[1]}/v1/chat/completions",
                    gw_headers,
                    chat,
                    True,
                    baseline=direct_cumulative,
                )
            )
        if litellm:
            cases.append(Case(direct_chat, f"{stub}/v1/chat/completions", {}, chat, stream))
            cases.append(
                Case(
                    lite,
                    f"{litellm}/v1/chat/completions",
                    lite_headers,
                    chat,
                    stream,
                    baseline=direct_chat,
                )
            )
    return cases


def stub_command(port: int, model_dir: Path, chunking: str) -> list[str]:
    script = str(ROOT / "bench/stub_engine.py")
    flags = ["--port", str(port), "--model-dir", str(model_dir), "--chunking", chunking]
    return [sys.executable, script, *flags]


def baseline_cases(cases: list[Case], url: str, pid: int | None) -> list[Case]:
    """The gateway's plain and streamed chat cases against the ``--baseline-src`` gateway (in
    front of the same stub): before and after, side by side."""
    out = []
    for name in ("areal gateway (plain)", "areal gateway (stream)"):
        mine = next(c for c in cases if c.name == name)
        out.append(
            Case(
                name.replace("areal gateway", "areal gateway at --baseline-src"),
                url.rstrip("/") + "/v1/chat/completions",
                mine.headers,
                mine.body,
                mine.stream,
                baseline=mine.baseline,
                pid=pid,
            )
        )
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from areal.plugins.models.tiny import init_tiny

    litellm_bin = None if args.no_litellm else find_litellm(args.litellm)
    litellm_note = None
    if not args.no_litellm and litellm_bin is None:
        litellm_note = (
            f"LiteLLM is not installed, so its rows are skipped; install it with `{LITELLM_INSTALL}`"
            " (or run `make bench-gateway`)"
        )
        print(litellm_note, file=sys.stderr)
    lengths: list[LengthCase] = []
    with tempfile.TemporaryDirectory(prefix="areal-bench-gateway-") as tmp:
        work = Path(tmp)
        model_dir = work / "nano"
        init_tiny(model_dir, size="nano", seed=0)
        gw_env = {"AREAL_GATEWAY_KEY": GATEWAY_KEY}
        with contextlib.ExitStack() as stack:
            # A stub and a gateway per chunking: incremental (the embedded engine's default, the
            # one the main table uses) and cumulative (SGLang's default), measured side by side.
            pairs: dict[str, tuple[str, str, int]] = {}
            for chunking in ("incremental", "cumulative"):
                stub_port, gw_port = pick_free_port(), pick_free_port()
                stub_url, gw_url = f"http://127.0.0.1:{stub_port}", f"http://127.0.0.1:{gw_port}"
                stub_cmd = stub_command(stub_port, model_dir, chunking)
                stack.enter_context(
                    server(f"stub-{chunking}", stub_cmd, f"{stub_url}/health", work)
                )
                gateway_proc = stack.enter_context(
                    server(
                        f"gateway-{chunking}",
                        gateway_command(stub_url, gw_port, work, None, f"router-{chunking}"),
                        f"{gw_url}/health",
                        work,
                        gw_env,
                    )
                )
                assert gateway_proc.pid is not None
                pairs[chunking] = (stub_url, gw_url, gateway_proc.pid)
            stub_url, gw_url, gw_pid = pairs["incremental"]
            lite_url, lite_proc = None, None
            if litellm_bin is not None:
                lite_port = pick_free_port()
                lite_url = f"http://127.0.0.1:{lite_port}"
                print("starting the LiteLLM proxy (takes a while) ...", file=sys.stderr)
                lite_proc = stack.enter_context(
                    server(
                        "litellm",
                        litellm_command(litellm_bin, stub_url, lite_port, work),
                        f"{lite_url}/health/liveliness",
                        work,
                        LITELLM_ENV,
                        timeout=300,
                    )
                )
            cumulative = pairs["cumulative"]
            cases = build_cases(stub_url, gw_url, lite_url, cumulative[:2])
            if args.baseline_src:  # another checkout's gateway, as it ran before this one
                base_port = pick_free_port()
                base_url = f"http://127.0.0.1:{base_port}"
                base_env = {**gw_env, "PYTHONPATH": str(Path(args.baseline_src).resolve())}
                base_cmd = gateway_command(stub_url, base_port, work, None, "router-base")
                base = stack.enter_context(
                    server("gateway-base", base_cmd, f"{base_url}/health", work, base_env)
                )
                cases += baseline_cases(cases, base_url, base.pid)
            for case in cases:  # the proxies' own CPU per request (the stub's is not theirs)
                if case.pid is not None:
                    continue
                if case.name.startswith("areal"):
                    case.pid = cumulative[2] if "cumulative" in case.name else gw_pid
                elif case.name.startswith("LiteLLM") and lite_proc is not None:
                    case.pid = lite_proc.pid
            asyncio.run(measure(cases, args))
            if args.lengths:
                lengths = asyncio.run(measure_lengths(pairs, args))
            profile = profile_gateway(stub_url, work, args) if args.profile else None
    rows = rows_of(cases)
    return {
        "settings": {
            "rounds": args.rounds,
            "sequential_requests_per_round": args.requests,
            "concurrency": args.concurrency,
            "load_requests": args.load_requests,
            "load_seconds": args.load_seconds,
            "max_tokens": MAX_TOKENS,
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
        },
        "rows": [asdict(r) for r in rows],
        "lengths": [lc.summary() for lc in lengths],
        "litellm": litellm_bin,
        "litellm_note": litellm_note,
        "profile": profile,
    }


# --- cost of a streamed request by its length -----------------------------------------------------


@dataclass
class LengthCase:
    """Streamed chat requests of ``tokens`` tokens through the gateway whose engine sends
    ``chunking`` chunks: the bytes the engine sent and the gateway's CPU, per request."""

    tokens: int
    chunking: str
    case: Case
    stub: str
    cpu_ms: list[float] = field(default_factory=list)
    wire_bytes: list[float] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return max(1, TOKENS_PER_CASE // self.tokens)

    def summary(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "chunking": self.chunking,
            "requests_per_round": self.requests,
            "bytes_per_stream": statistics.median(self.wire_bytes) if self.wire_bytes else None,
            "cpu_ms_per_stream": statistics.median(self.cpu_ms) if self.cpu_ms else None,
            "rounds": len(self.cpu_ms),
            "errors": self.case.errors,
            "skipped": self.case.skipped,
        }


async def stub_stream_bytes(session: aiohttp.ClientSession, stub: str) -> int:
    async with session.get(f"{stub}/stats") as resp:
        return int((await resp.json())["stream_bytes"])


async def measure_lengths(
    pairs: dict[str, tuple[str, str, int]], args: argparse.Namespace
) -> list[LengthCase]:
    """Rounds of every (length, chunking) case in turn, so both chunkings see the same load;
    each case sends ``TOKENS_PER_CASE`` tokens' worth of streams, 8 at a time at most."""
    headers = {"Authorization": f"Bearer {GATEWAY_KEY}"}
    cases: list[LengthCase] = []
    for tokens in STREAM_LENGTHS:
        for chunking in CHUNKINGS:
            stub, gateway, pid = pairs[chunking]
            body = {"model": MODEL, "messages": MESSAGES, "max_tokens": tokens}
            url = f"{gateway}/v1/chat/completions"
            case = Case(f"{tokens} tokens, {chunking}", url, headers, body, True, pid=pid)
            cases.append(LengthCase(tokens, chunking, case, stub))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        for lc in cases:
            if lc.tokens == min(STREAM_LENGTHS):  # one that must work before any is measured
                await probe(session, lc.case)
                if lc.case.skipped:
                    raise RuntimeError(f"{lc.case.name}: {lc.case.skipped}")
        for r in range(args.rounds):
            for lc in cases:
                assert lc.case.pid is not None
                cpu, sent = cpu_seconds(lc.case.pid), await stub_stream_bytes(session, lc.stub)
                _, done = await under_load(lc.case, min(8, lc.requests), lc.requests, 600.0)
                if done:
                    lc.cpu_ms.append(1000 * (cpu_seconds(lc.case.pid) - cpu) / done)
                    lc.wire_bytes.append((await stub_stream_bytes(session, lc.stub) - sent) / done)
            print(f"  lengths: round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    return cases


# --- profile -------------------------------------------------------------------------------------

# Where a frame's own time is charged, by the first matching fragment of its file name or function.
BUCKETS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("idle (waiting in epoll)", ("method 'poll' of 'select.epoll'", "select.epoll")),
    (
        "chat template (jinja2, transformers)",
        ("jinja2", "chat_template", "transformers/", "<template>"),
    ),
    ("tokenizer (encode)", ("tokenizers", "tokenization_utils")),
    ("aiohttp client (engine call)", ("aiohttp/client", "aiohttp/connector", "aiohttp/streams")),
    ("aiohttp server", ("aiohttp/web", "aiohttp/http", "aiohttp/")),
    ("json", ("json/", "orjson", "json.")),
    ("access log, logging", ("access_log", "logging/")),
    ("areal gateway", ("areal/gateway",)),
    ("areal core (inference client)", ("areal/core",)),
    ("asyncio, sockets", ("asyncio/", "socket", "ssl")),
)


# Stages of a request: (label, file name ending, function); their cumulative time per request.
STAGES: tuple[tuple[str, str, str], ...] = (
    ("aiohttp request handling, all of it", "aiohttp/web_protocol.py", "_handle_request"),
    ("gateway middleware (auth, errors, log)", "areal/gateway/app.py", "gateway_middleware"),
    ("render: chat template + tokenize", "areal/gateway/policy.py", "render"),
    ("  apply_chat_template", "transformers/tokenization_utils_base.py", "apply_chat_template"),
    ("  tokenizer.encode", "transformers/tokenization_utils_base.py", "encode"),
    ("engine call, plain (policy.generate)", "areal/gateway/policy.py", "generate"),
    ("engine call, stream (policy.stream)", "areal/gateway/policy.py", "stream"),
    ("socket send", "~", "<method 'send' of '_socket.socket' objects>"),
    ("access log line", "areal/gateway/access_log.py", "write"),
)


def bucket_of(key: tuple[str, int, str]) -> str:
    filename, _, func = key
    text = f"{filename} {func}"
    for name, fragments in BUCKETS:
        if any(f in text for f in fragments):
            return name
    return "other"


def profile_gateway(stub_url: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Drive a gateway running under cProfile and charge its CPU time to where it went."""
    out = work / "gateway.prof"
    port = pick_free_port()
    url = f"http://127.0.0.1:{port}"
    env = {"AREAL_GATEWAY_KEY": GATEWAY_KEY}
    n_plain, n_stream = args.profile_requests, args.profile_requests // 4
    cases = [c for c in build_cases(stub_url, url, None) if c.name.startswith("areal")]
    command = gateway_command(stub_url, port, work, out)
    with server("gateway-profile", command, f"{url}/health", work, env) as proc:
        assert proc.pid is not None
        pid = proc.pid

        async def warm() -> None:
            for case in cases:  # warm up, then profile only the requests
                await under_load(case, 16, 200, 30.0)

        async def drive() -> None:
            await asyncio.sleep(0.2)
            for case in cases:
                await under_load(case, 16, n_stream if case.stream else n_plain, 120.0)

        asyncio.run(warm())
        profile_while(pid, out, lambda: asyncio.run(drive()))
    if not out.exists():
        return {"error": "the profiled gateway wrote no profile"}
    if any(c.errors for c in cases):
        return {
            "error": "requests failed while profiling: "
            + ", ".join(f"{c.name}: {c.errors}" for c in cases)
        }
    if args.profile_out:
        shutil.copyfile(out, args.profile_out)
    stats = pstats.Stats(str(out))
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    buckets: dict[str, float] = {}
    for key, (_, _, tottime, _, _) in raw.items():
        buckets[bucket_of(key)] = buckets.get(bucket_of(key), 0.0) + tottime
    idle = buckets.pop("idle (waiting in epoll)", 0.0)
    busy = sum(buckets.values())
    requests = n_plain + n_stream
    top = sorted(raw.items(), key=lambda kv: kv[1][2], reverse=True)[:20]
    stages = {}
    for label, file_end, func in STAGES:
        cum = sum(v[3] for k, v in raw.items() if k[0].endswith(file_end) and k[2] == func)
        stages[label] = round(cum / requests * 1000, 3)
    return {
        "requests": requests,
        "cpu_ms_per_request_under_cprofile": busy / requests * 1000,
        "idle_s": idle,
        "stages_ms_per_request": stages,
        "buckets_pct": {
            k: round(100 * v / busy, 1) for k, v in sorted(buckets.items(), key=lambda kv: -kv[1])
        },
        "top_tottime": [
            {
                "function": f"{Path(k[0]).name}:{k[1]}({k[2]})",
                "tottime_s": round(v[2], 3),
                "calls": v[1],
            }
            for k, v in top
        ],
    }


# --- output --------------------------------------------------------------------------------------


def fmt(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "—" if value is None else f"{value:{spec}}{suffix}"


def print_report(result: dict[str, Any]) -> None:
    s = result["settings"]
    print(
        f"\nGateway benchmark: {s['rounds']} rounds × {s['sequential_requests_per_round']} "
        f"sequential requests per case; load: {s['concurrency']} clients, ≤ {s['load_requests']} "
        f"requests or {s['load_seconds']:g} s per round; stub answers {s['max_tokens']} tokens.\n"
    )
    header = ("case", "p50 ms", "p99 ms", "added p50 ms", "req/s @64", "CPU ms/req", "vs LiteLLM")
    lines = [header]
    for r in result["rows"]:
        if r["p50_ms"] is None:
            lines.append((r["case"], "—", "—", "—", "—", "—", f"skipped: {r['note']}"))
            continue
        versus = ""
        if r["rps_vs_litellm"] is not None:
            versus = f"{r['rps_vs_litellm']:.1f}× req/s"
            if r["added_vs_litellm"] is not None:
                versus += f", {r['added_vs_litellm']:.0f}× less added"
        if r["note"]:
            versus = f"{versus} ({r['note']})".strip()
        lines.append(
            (
                r["case"],
                fmt(r["p50_ms"]),
                fmt(r["p99_ms"]),
                fmt(r["added_p50_ms"], "+.2f"),
                fmt(r["rps_at_64"], ",.0f"),
                fmt(r["cpu_ms_per_request"], ".3f"),
                versus,
            )
        )
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    for i, line in enumerate(lines):
        cells = [
            str(c).ljust(w) if j in (0, 6) else str(c).rjust(w)
            for j, (c, w) in enumerate(zip(line, widths, strict=True))
        ]
        print("  ".join(cells).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print()
    for r in result["rows"]:
        if r["case"].startswith("areal gateway") and r["p50_ms"] is not None:
            added_ok = r["added_p50_ms"] is not None and r["added_p50_ms"] <= TARGET_ADDED_MS
            rps_ok = r["rps_at_64"] >= TARGET_RPS
            print(
                f"{r['case']}: added p50 {fmt(r['added_p50_ms'])} ms (target ≤ {TARGET_ADDED_MS}: "
                f"{'met' if added_ok else 'NOT met'}), {fmt(r['rps_at_64'], ',.0f')} req/s @64 "
                f"(target ≥ {TARGET_RPS:,.0f}: {'met' if rps_ok else 'NOT met'})"
            )
            if r["cpu_ms_per_request"]:
                print(
                    f"  {r['cpu_ms_per_request']:.3f} ms of gateway CPU per request under load: "
                    f"one gateway core serves ≈ {1000 / r['cpu_ms_per_request']:,.0f} req/s"
                )
        elif r["case"].startswith("areal gateway"):
            print(f"{r['case']}: not measured: {r['note']}")
    if result["litellm_note"]:
        print(result["litellm_note"])
    print_lengths(result["lengths"])
    prof = result["profile"]
    if prof and "error" not in prof:
        print(
            f"\nWhere the gateway's CPU time goes (cProfile, {prof['requests']} requests at 16 "
            f"concurrent; {prof['cpu_ms_per_request_under_cprofile']:.2f} ms CPU per request "
            "with the profiler's own overhead):"
        )
        print("  by stage (cumulative ms per request, averaged over plain and streamed):")
        for name, ms in prof["stages_ms_per_request"].items():
            print(f"    {ms:6.3f} ms  {name}")
        print("  by library (share of the busy time, own time of each function):")
        for name, pct in prof["buckets_pct"].items():
            print(f"    {pct:5.1f} %  {name}")
        print("  top functions by own time:")
        for f in prof["top_tottime"][:15]:
            print(f"    {f['tottime_s']:7.3f} s  {f['calls']:>8}  {f['function']}")
    elif prof:
        print(prof["error"])


def print_lengths(lengths: list[dict[str, Any]]) -> None:
    """Bytes on the engine→gateway wire and gateway CPU per streamed request, by length."""
    if not lengths:
        return
    print(
        "\nA streamed chat request by its length (medians over rounds; the engine streams "
        "cumulative chunks, as SGLang by default, or incremental ones, as the embedded engine):"
    )
    by = {(r["tokens"], r["chunking"]): r for r in lengths}
    header = ("tokens", "streams/round", "engine→gateway bytes", "", "gateway CPU ms", "")
    lines = [header, ("", "", "cumulative", "incremental", "cumulative", "incremental")]
    for tokens in sorted({r["tokens"] for r in lengths}):
        cum, inc = by.get((tokens, "cumulative")), by.get((tokens, "incremental"))
        if cum is None or inc is None:
            continue
        lines.append(
            (
                f"{tokens:,}",
                str(inc["requests_per_round"]),
                fmt(cum["bytes_per_stream"], ",.0f"),
                fmt(inc["bytes_per_stream"], ",.0f"),
                fmt(cum["cpu_ms_per_stream"], ",.1f"),
                fmt(inc["cpu_ms_per_stream"], ",.1f"),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  " + "  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)))
    errors = [f"{r['tokens']} {r['chunking']}: {r['errors']}" for r in lengths if r["errors"]]
    if errors:
        print("  errors: " + ", ".join(errors))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200, help="sequential, per case per round")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--load-requests", type=int, default=3000, help="per case per round")
    parser.add_argument("--load-seconds", type=float, default=3.0, help="per case per round")
    parser.add_argument("--litellm", help="the litellm executable (default: .venv/litellm/bin)")
    parser.add_argument("--no-litellm", action="store_true", help="skip the LiteLLM rows")
    parser.add_argument(
        "--no-lengths",
        dest="lengths",
        action="store_false",
        help="skip the bytes and gateway CPU per streamed request at 64, 512 and 4,096 tokens",
    )
    parser.add_argument(
        "--baseline-src",
        metavar="DIR",
        help="also measure the gateway of another checkout's src/ (e.g. `git archive REV src`) "
        "in front of the same stub: the plain and streamed requests before a change",
    )
    parser.add_argument("--profile", action="store_true", help="also profile the gateway")
    parser.add_argument("--profile-requests", type=int, default=2000)
    parser.add_argument("--profile-out", help="also keep the gateway's pstats file here")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--profiled-gateway", metavar="OUT", help=argparse.SUPPRESS)
    parser.add_argument("server_args", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.profiled_gateway:
        return serve_profiled(args.profiled_gateway, args.server_args)
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
