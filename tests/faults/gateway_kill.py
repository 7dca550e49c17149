"""Hand measurements of a gateway SIGKILLed in the middle of a real ``areal train`` run:
``python tests/faults/gateway_kill.py OUT STEPS KILL_AT [--src SRC] [--set KEY=VALUE ...]`` prints
what the run recorded (stale drops before and after the kill, its episode books, its restarts).
The harness is ``support.runs`` (``run_and_kill``), which the fault tests use too."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the support package

from support.runs import run_and_kill, summary


def main() -> None:
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


if __name__ == "__main__":
    main()
