"""Run ``areal train`` as a real process, SIGKILL its gateway at a given step, and read back what
the run recorded (``fault_run.py`` does the work, for any of the run's processes). Shared by the
fault test and by hand measurements
(``python tests/faults/gateway_kill.py OUT STEPS KILL_AT [--src SRC] [--set KEY=VALUE ...]``)."""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any


def _fault_run() -> ModuleType:
    """The shared helper beside this file (also what conftest's ``fault_run`` fixture loads)."""
    name = "areal_tests_fault_run"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, Path(__file__).with_name("fault_run.py")
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[name]


fault_run = _fault_run()
ROOT: Path = fault_run.ROOT
QUICKSTART: Path = fault_run.QUICKSTART


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
    done = fault_run.run(
        out,
        steps=steps,
        faults=[fault_run.Fault("gateway", kill_at)],
        overrides=overrides,
        src=src,
        timeout=timeout,
    )
    hit = done.injected[0] if done.injected else None
    return KilledRun(
        done.returncode if done.returncode is not None else -1,
        done.seconds,
        hit.step if hit else 0,
        hit.pythonpath if hit else "",
        done.events,
        done.trained,
    )


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
