"""Run pip of the running interpreter, the way ``areal plug install/uninstall`` needs it.

pip always installs into the environment areal runs in (``sys.executable -m pip``), so a plugin
lands where areal will look for it. Its output goes to stderr as it comes (scripts read ``--json``
on stdout); on failure the last ``ERROR:`` lines become the one-line message, because pip's real
reason is usually buried under a build log.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from areal.cli.errors import CLIError

_PROJECT_FILES = ("pyproject.toml", "setup.py", "setup.cfg")
_ARCHIVES = (".whl", ".tar.gz", ".tgz", ".zip", ".tar.bz2")
_REQUIREMENT_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")


@dataclass(frozen=True)
class Installed:
    """One distribution pip installed (``requested``: named on the command line, not a dependency)."""

    name: str
    version: str
    requested: bool


def pip_target(spec: str) -> tuple[str, str | None]:
    """What pip should get for ``spec`` and the distribution name it should be, if known now.

    A URL (or VCS URL) goes through as is; a path must be a Python project or an archive, and goes
    as an absolute path; anything else is a requirement (``areal-foo``, ``areal-foo>=1.2``).
    """
    if "://" in spec or spec.startswith(("git+", "hg+", "svn+", "bzr+")):
        return spec, None
    path = Path(spec).expanduser()
    looks_like_path = (
        os.sep in spec or spec.startswith(".") or spec.endswith(_ARCHIVES) or path.is_dir()
    )
    if not looks_like_path:
        match = _REQUIREMENT_NAME.match(spec)
        if match is None:
            raise CLIError(f"{spec!r} is neither a package name, a path nor a URL")
        return spec, match.group(0)
    if not path.exists():
        raise CLIError(f"{spec}: no such file or directory; give a package name, a path or a URL")
    if path.is_dir() and not any((path / name).is_file() for name in _PROJECT_FILES):
        raise CLIError(
            f"{spec} is not a Python package (no pyproject.toml or setup.py in it); "
            "point at the folder that holds the plugin's pyproject.toml"
        )
    return str(path.resolve()), None


def run_pip(args: Sequence[str], *, echo: TextIO | None, action: str) -> None:
    """Run ``python -m pip ARGS``; raise :class:`CLIError` quoting pip's error lines on failure.

    ``echo`` receives pip's output line by line as it runs (None: stay quiet).
    """
    command = [sys.executable, "-m", "pip", *args]
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONUNBUFFERED": "1"}
    tail: deque[str] = deque(maxlen=200)
    try:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )
    except OSError as exc:
        raise CLIError(f"could not start pip ({sys.executable} -m pip): {exc}") from None
    assert process.stdout is not None
    with process:
        for line in process.stdout:
            tail.append(line.rstrip())
            if echo is not None:
                echo.write(line)
                echo.flush()
    if process.returncode != 0:
        raise CLIError(f"pip {action} failed (exit {process.returncode}): {pip_error(list(tail))}")


def pip_error(lines: Sequence[str]) -> str:
    """pip's own ``ERROR:`` lines (at most the last three), else its last non-empty lines."""
    errors = [line.strip() for line in lines if line.startswith("ERROR:")]
    if not errors:
        errors = [line.strip() for line in lines if line.strip()][-3:]
    if not errors:
        return "pip printed nothing"
    return "; ".join(errors[-3:])


def install(
    target: str,
    *,
    editable: bool,
    upgrade: bool,
    no_deps: bool,
    no_build_isolation: bool,
    pip_args: Sequence[str] = (),
    echo: TextIO | None,
) -> list[Installed]:
    """``pip install`` one target; what pip installed, read from its ``--report``."""
    with tempfile.TemporaryDirectory(prefix="areal-plug-") as tmp:
        report = Path(tmp) / "report.json"
        args = ["install", "--report", str(report)]
        args += ["--upgrade"] if upgrade else []
        args += ["--no-deps"] if no_deps else []
        args += ["--no-build-isolation"] if no_build_isolation else []
        args += [*pip_args, *(["-e", target] if editable else [target])]
        run_pip(args, echo=echo, action="install")
        return read_report(report)


def read_report(path: Path) -> list[Installed]:
    """The ``install`` list of pip's installation report (empty when pip had nothing to do)."""
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    found = []
    for item in data.get("install", []):
        meta = item.get("metadata", {})
        if "name" in meta:
            found.append(
                Installed(meta["name"], str(meta.get("version", "")), bool(item.get("requested")))
            )
    return found


def uninstall(distribution: str, *, echo: TextIO | None) -> None:
    """``pip uninstall -y DISTRIBUTION``."""
    run_pip(["uninstall", "-y", distribution], echo=echo, action="uninstall")
