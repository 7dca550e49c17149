"""Run ``areal train`` as a real process, SIGKILL its gateway at a given step, and read back what
the run recorded. Shared by the fault test and by hand measurements
(``python tests/faults/gateway_kill.py OUT STEPS KILL_AT [--src SRC] [--set KEY=VALUE ...]``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


@dataclass
class KilledRun:
    returncode: int
    seconds: float
    killed_at_step: int
    gateway_pythonpath: str  # the killed child's PYTHONPATH: which areal it ran
    events: list[dict[str, Any]] = field(default_factory=list)
    trained: list[dict[str, Any]] = field(default_factory=list)

    def last(self, event: str) -> dict[str, Any]:
        return [e for e in self.events if e["event"] == event][-1]

    def stale_at(self, step: int) -> int:
        """Samples dropped as stale by the end of ``step`` (0 before the first)."""
        trains = [e for e in self.events if e["event"] == "train" and e["step"] <= step]
        return int(trains[-1]["dropped_stale"]) if trains else 0


def _gateway(run: psutil.Process) -> psutil.Process | None:
    for proc in run.children(recursive=True):
        try:
            if "areal.gateway.server" in " ".join(proc.cmdline()):
                return proc
        except psutil.Error:
            continue
    return None


def _steps(log: Path) -> int:
    if not log.exists():
        return 0
    return sum(line.startswith("[train] step=") for line in log.read_text().splitlines())


def run_and_kill(
    out: Path,
    *,
    steps: int,
    kill_at: int,
    src: Path | None = None,
    timeout: float = 600.0,
    overrides: tuple[str, ...] = (),
) -> KilledRun:
    """``areal train configs/quickstart.yaml`` for ``steps`` steps, the gateway killed once the
    run logged ``kill_at`` steps. ``src``: which areal to run (default: this checkout's);
    ``overrides``: more ``--set`` values."""
    logs = out / "logs"
    env = {**os.environ, "PYTHONPATH": str(src or ROOT / "src")}
    command = [sys.executable, "-m", "areal", "train", str(QUICKSTART), "--output-dir", str(out)]
    for override in (
        f"train.max_steps={steps}",
        f"logging.log_dir={logs}",
        f"model.path={out.parent / 'model'}",  # areal's tiny model, created once per folder
        "logging.save_interval=1000",
        *overrides,
    ):
        command += ["--set", override]
    started = time.monotonic()
    proc = subprocess.Popen(
        command, env=env, cwd=out.parent, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    run = psutil.Process(proc.pid)
    killed_at, pythonpath = 0, ""
    try:
        while proc.poll() is None and time.monotonic() - started < timeout:
            done = _steps(logs / "train.log")
            if not killed_at and done >= kill_at and (gateway := _gateway(run)) is not None:
                pythonpath = gateway.environ().get("PYTHONPATH", "")
                gateway.send_signal(signal.SIGKILL)
                killed_at = done
            time.sleep(0.05)
        code = proc.wait(timeout=max(1.0, timeout - (time.monotonic() - started)))
    finally:
        if proc.poll() is None:
            proc.kill()
    metrics = logs / "metrics.jsonl"
    events = [json.loads(line) for line in metrics.read_text().splitlines()]
    audit = out / "run" / "trained.jsonl"
    trained = [json.loads(line) for line in audit.read_text().splitlines()]
    return KilledRun(code, time.monotonic() - started, killed_at, pythonpath, events, trained)


def summary(run: KilledRun, steps: int) -> dict[str, Any]:
    before = run.stale_at(run.killed_at_step)
    after = run.stale_at(steps) - before
    acc = run.last("accounting")
    return {
        "returncode": run.returncode,
        "seconds": round(run.seconds, 1),
        "killed_at_step": run.killed_at_step,
        "gateway_pythonpath": run.gateway_pythonpath,
        "stale_before": before,
        "stale_after": after,
        "received": run.last("train").get("received"),
        "accounting": {k: v for k, v in acc.items() if k.startswith("episodes_")},
        "restarts": acc.get("restarts"),
    }


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("steps", type=int)
    parser.add_argument("kill_at", type=int)
    parser.add_argument("--src", type=Path, help="the areal to run (default: this checkout's)")
    parser.add_argument("--set", action="append", default=[], help="more config overrides")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = run_and_kill(
        args.out, steps=args.steps, kill_at=args.kill_at, src=args.src, overrides=tuple(args.set)
    )
    print(json.dumps(summary(result, args.steps), indent=2))
