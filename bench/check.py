"""The regression gate: the fast benchmarks' ratios against ``bench/baseline.json``.

Run: ``make bench-check`` or ``.venv/bin/python bench/check.py [--strict] [--rounds N]
[--only engine gateway queue async] [--update]``.

Runs the engine, gateway, queue and (quick) async-vs-sync benchmarks as subprocesses with small
sizes, reads their ``--json`` output and keeps only ratios measured within one run (ours / a
baseline beside it in the same run), which move far less between machines and loads than
absolute rates. Each is compared with the baseline file; the table says which fell by more than
its noise band (``bench/gate.py``). It exits 0 whatever it finds (this box is shared, and a
gate that fails on noise gets switched off) unless ``--strict``: then a fall, or a benchmark
that failed, exits 1.

``--update --rounds 5`` measures a new baseline: each ratio's median over the rounds and its
band, the rounds' spread. ``--only`` with ``--update`` replaces those benchmarks' entries and
keeps the others.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from gate import (  # noqa: E402
    baseline_entries,
    baseline_for,
    compare,
    hosts_of,
    median_of_rounds,
    table,
)

BASELINE = BENCH / "baseline.json"


@dataclass(frozen=True)
class Bench:
    """One benchmark as the gate runs it: its fast command line and the ratios it yields."""

    name: str
    args: tuple[str, ...]  # after ``python``; "{json}" stands for a file the JSON goes to
    ratios: Callable[[Any], dict[str, float]]
    what: dict[str, str]  # ratio -> what it is, for the baseline file


def _engine(out: Any) -> dict[str, float]:
    return {
        "engine_batch1_vs_transformers": out["ratio_batch1"],
        "engine_16_vs_transformers_padded": out["ratio_16_vs_padded_batch"],
    }


def _gateway(out: Any) -> dict[str, float]:
    rps = {row["case"]: row["rps_at_64"] for row in out["rows"]}
    ratios = {}
    for kind in ("plain", "stream"):
        mine, direct = (
            rps.get(f"areal gateway ({kind})"),
            rps.get(f"stub /generate, direct ({kind})"),
        )
        if mine and direct:
            ratios[f"gateway_rps_vs_direct_{kind}"] = mine / direct
    return ratios


def _queue(out: Any) -> dict[str, float]:
    return {f"queue_vs_raw_{row['tokens'] // 1024}k": row["ratio"] for row in out}


def _async(out: Any) -> dict[str, float]:
    # Not async / bound: its phases run one after another, not alternated, so a load that
    # changes between them moves it by several times (measured: 0.56 to 3.6 in three rounds).
    return {"async_over_sync": out["rates"]["async_over_sync"]}


BENCHES = (
    Bench(
        "engine",
        ("generate.py", "--json", "--no-vllm", "--repeats", "2", "--waves", "1"),
        _engine,
        {
            "engine_batch1_vs_transformers": "embedded engine / transformers generate(), tokens/s, batch 1",
            "engine_16_vs_transformers_padded": "engine with 16 concurrent requests / one padded "
            "generate() batch of 16, tokens/s",
        },
    ),
    Bench(
        "gateway",
        (
            "gateway.py",
            "--json",
            "--no-litellm",
            "--rounds",
            "2",
            "--requests",
            "100",
            "--warmup",
            "20",
            "--load-requests",
            "1500",
            "--load-seconds",
            "1.5",
        ),
        _gateway,
        {
            "gateway_rps_vs_direct_plain": "req/s at 64 clients through the gateway / straight to "
            "the stub engine",
            "gateway_rps_vs_direct_stream": "the same, streamed",
        },
    ),
    Bench(
        "queue",
        (
            "trajectory_queue.py",
            "--json",
            "--tokens",
            "1024",
            "8192",
            "--rounds",
            "2",
            "--megabytes",
            "40",
        ),
        _queue,
        {
            "queue_vs_raw_1k": "trajectories/s, areal's ZeroMQ queue / raw PUSH-PULL, 1k tokens",
            "queue_vs_raw_8k": "the same, 8k tokens",
        },
    ),
    Bench(
        "async",
        ("async_vs_sync.py", "--quick", "--json", "{json}"),
        _async,
        {
            "async_over_sync": "samples/s, async run / sync run (--quick)",
        },
    ),
)


def run_bench(bench: Bench, timeout: float, extra: Sequence[str] = ()) -> dict[str, float]:
    """Run one benchmark (``extra`` appended to its arguments, so they override them); its
    ratios, or an empty dict (and why, on stderr) if it failed."""
    with tempfile.TemporaryDirectory(prefix="areal-check-") as tmp:
        json_path = Path(tmp) / "out.json"
        args = [a.replace("{json}", str(json_path)) for a in (*bench.args, *extra)]
        command = [sys.executable, str(BENCH / args[0]), *args[1:]]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout, cwd=BENCH.parent
            )
        except subprocess.TimeoutExpired:
            print(f"{bench.name}: no result within {timeout:.0f} s", file=sys.stderr)
            return {}
        if done.returncode != 0:
            tail = "\n".join(done.stderr.splitlines()[-15:])
            print(f"{bench.name}: exit {done.returncode}\n{tail}", file=sys.stderr)
            return {}
        try:
            out = (
                json.loads(json_path.read_text())
                if "{json}" in bench.args
                else _json_of(done.stdout)
            )
            return {k: float(v) for k, v in bench.ratios(out).items()}
        except (ValueError, KeyError, TypeError) as err:
            print(f"{bench.name}: unreadable output ({err!r})", file=sys.stderr)
            return {}


def _json_of(stdout: str) -> Any:
    """The JSON a benchmark printed: all of stdout, or its last line after a table."""
    try:
        return json.loads(stdout)
    except json.JSONDecodeError:
        return json.loads(stdout.strip().splitlines()[-1])


def measure(
    benches: list[Bench], rounds: int, timeout: float, extra: Mapping[str, Sequence[str]]
) -> list[dict[str, float]]:
    """``rounds`` rounds, each running every benchmark once (so drift hits them all alike)."""
    results = []
    for i in range(rounds):
        found: dict[str, float] = {}
        for bench in benches:
            started = time.monotonic()
            print(
                f"[round {i + 1}/{rounds}] {bench.name} ...", end=" ", file=sys.stderr, flush=True
            )
            got = run_bench(bench, timeout, extra.get(bench.name, ()))
            print(f"{time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
            found.update(got)
        results.append(found)
    return results


def host() -> tuple[str, str]:
    """This machine as the baseline file keys it, and its CPU's name (for people). The key is
    what moves the ratios between machines: the instruction set that picks the engine's kernels
    (oneDNN's packed weights paid on an AVX2 host and not on an AVX-512 one) and the cores."""
    flags: set[str] = set()
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "flags" and not flags:
                flags = set(value.split())
            elif name.strip() == "model name":
                cpu = value.strip()
    if "amx_tile" in flags:
        isa = "avx512+amx"
    elif "avx512f" in flags:
        isa = "avx512"
    elif "avx2" in flags:
        isa = "avx2"
    else:
        isa = platform.machine() or "unknown"
    return f"{isa}, {os.cpu_count()} cpus", cpu


def baseline_history(old: str | None, kept: set[str], command: str, today: str) -> str:
    """The file's top-level ``command``: this run's alone when it re-measured every entry, else
    appended to the commands behind the entries it kept, so the file still says how each of its
    figures was made (each entry also names its own command)."""
    if not old or not kept:
        return command
    return f"{old}; later ({today}): {command}"


def write_baseline(
    path: Path,
    benches: list[Bench],
    rounds: list[dict[str, float]],
    load: tuple[float, ...],
    command: str,
    machine: tuple[str, str],
) -> None:
    """This host's baseline, from ``rounds``: its entries for ``benches`` replaced, its others and
    every other host's kept."""
    key, cpu = machine
    hosts = hosts_of(json.loads(path.read_text())) if path.exists() else {}
    old = hosts.get(key, {})
    entries = dict(old.get("ratios", {}))
    what = {k: v for b in benches for k, v in b.what.items()}
    today = datetime.date.today().isoformat()
    for name, entry in baseline_entries(rounds).items():
        if name in what:  # a ratio the gate no longer reads stays out
            entries[name] = {
                **entry,
                "what": what[name],
                "measured": today,
                "load": list(load),
                "command": command,
            }
    kept = set(old.get("ratios", {})) - set(what)
    command = baseline_history(old.get("command"), kept, command, today)
    hosts[key] = {
        "cpu": cpu,
        "command": command,
        "measured": today,
        "machine": {
            "cpus": os.cpu_count(),
            "load_average_1min": list(load),  # before and after each measuring run
        },
        "ratios": entries,
    }
    doc = {
        "about": (
            "Ratios of bench/check.py's fast benchmarks, each ours / a baseline measured in the "
            "same run (higher is better), one baseline per host (its instruction set and cores: "
            "bench/check.py's host()). value: the median over the rounds; band: the rounds' "
            "spread, (max - min) / median, at least 5 %; a later check flags a ratio below "
            "value * (1 - band)."
        ),
        "hosts": hosts,
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    names = [b.name for b in BENCHES]
    parser.add_argument("--only", nargs="+", choices=names, default=names)
    parser.add_argument("--rounds", type=int, default=1, help="runs of each benchmark (median)")
    parser.add_argument("--baseline", type=Path, default=BASELINE)
    parser.add_argument("--strict", action="store_true", help="exit 1 when a ratio fell")
    parser.add_argument("--update", action="store_true", help="rewrite the baseline from this run")
    parser.add_argument(
        "--extra",
        nargs=2,
        action="append",
        default=[],
        metavar=("BENCH", "ARGS"),
        help="more arguments for one benchmark, e.g. --extra queue '--rounds 1'",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per benchmark run")
    parser.add_argument("--json", type=Path, help="also write the measurements and verdicts here")
    parser.add_argument(
        "--reuse",
        type=Path,
        nargs="+",
        help="compare the measurements of earlier --json runs instead of measuring",
    )
    args = parser.parse_args(argv)
    benches = [b for b in BENCHES if b.name in args.only]
    machine = host()
    load_before = round(os.getloadavg()[0], 2)
    this_command = "python bench/check.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.reuse:  # the measurements and the loads they were taken under, all files together
        kept = [json.loads(path.read_text()) for path in args.reuse]
        rounds = [r for k in kept for r in k["rounds"]]
        load = tuple(x for k in kept for x in k.get("load", (load_before, load_before)))
        elsewhere = sorted({k["host"] for k in kept if k.get("host", machine[0]) != machine[0]})
        if elsewhere:
            print(f"note: some of these runs were measured on {', '.join(elsewhere)}, not here")
    else:
        extra = {name: shlex.split(text) for name, text in args.extra}
        rounds = measure(benches, max(1, args.rounds), args.timeout, extra)
        load = (load_before, round(os.getloadavg()[0], 2))
    print("load average (1 min) before and after:", ", ".join(f"{x:.2f}" for x in load))
    if max(load) > (os.cpu_count() or 1):
        print("note: the machine was busier than its cores; expect ratios outside their bands")
    if args.update:
        if len(rounds) < 3:
            print(
                "note: a band from fewer than 3 rounds says little about the noise", file=sys.stderr
            )
        command = this_command
        if args.reuse:  # the runs that measured, then the update that combined them
            runs = "; ".join(str(k.get("command", "?")) for k in kept)
            command = f"{runs}; then {this_command}"
        write_baseline(args.baseline, benches, rounds, load, command, machine)
        print(f"wrote {args.baseline} ({machine[0]})")
    doc = json.loads(args.baseline.read_text()) if args.baseline.exists() else {}
    whose, entry = baseline_for(doc, machine[0])
    baseline = entry.get("ratios", {})
    if whose is not None and whose != machine[0]:
        print(
            f"note: no baseline for this host ({machine[0]}, {machine[1]}); compared with "
            f"{whose}'s, whose ratios are that CPU's as well as that code's: measure this "
            "host's with --update --rounds 7"
        )
    expected = {k for b in benches for k in b.what}
    now = {k: v for k, v in median_of_rounds(rounds).items() if k in expected}
    verdicts = compare({k: v for k, v in baseline.items() if k in expected}, now)
    print(table(verdicts))
    fell = [v for v in verdicts if v.fell]
    failed = [v for v in verdicts if v.verdict == "missing"]
    for v in fell:
        print(f"FELL: {v.name} {v.baseline:.3f} -> {v.now:.3f} ({100 * (v.change or 0):+.1f} %, "
              f"band ±{100 * (v.band or 0):.1f} %)")  # fmt: skip
    if args.json:
        verdicts_out = [{**v.__dict__, "change": v.change} for v in verdicts]
        args.json.write_text(
            json.dumps(
                {
                    "command": this_command,
                    "host": machine[0],
                    "baseline_host": whose,
                    "rounds": rounds,
                    "load": load,
                    "verdicts": verdicts_out,
                },
                indent=2,
            )
        )
    return 1 if args.strict and (fell or failed) else 0


if __name__ == "__main__":
    sys.exit(main())
