"""What another Python environment has installed, asked in a subprocess of that interpreter: the
engines live in venvs of their own, and importing them here would pull in torch and CUDA."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence

_PROBE = """
import importlib.metadata as md, json, sys
found = {}
for name in sys.argv[1:]:
    try:
        found[name] = md.version(name)
    except md.PackageNotFoundError:
        pass
print(json.dumps(found))
"""


class InterpreterError(RuntimeError):
    """The interpreter could not be run at all."""


def installed_versions(
    python: str, distributions: Sequence[str], env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``{distribution: version}`` for those of ``distributions`` that ``python`` has."""
    try:
        result = subprocess.run(
            [python, "-c", _PROBE, *distributions],
            env={**os.environ, **(env or {})},
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InterpreterError(f"cannot run {python}: {exc}") from exc
    if result.returncode != 0:
        raise InterpreterError(f"{python} failed: {result.stderr.strip()[-300:]}")
    found: dict[str, str] = json.loads(result.stdout.strip().splitlines()[-1])
    return found
