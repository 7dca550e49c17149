"""The real Claude Code CLI (npm ``@anthropic-ai/claude-code``), headless, against the gateway.

``make setup`` installs the pinned CLI into ``.cache/npm``; without it these tests skip and say
how to install it (under ``CI=true`` that skip is a failure). Claude Code talks to nothing but the gateway on 127.0.0.1:
HOME is a fresh directory (no OAuth credentials), telemetry, updates and other traffic are off.

Its default prompt (system prompt plus ~20 tool schemas) is ~35k tokens, far beyond the test
policy's 4096-token context, so the runs that must succeed use ``--bare --tools ""`` (a prompt of a
few hundred tokens), and the default prompt checks that an oversized prompt is a clear 400 that
the CLI shows, not a hang. The untrained policy rarely ends a turn by itself: each reply stops at
Claude Code's output cap, and Claude Code asks it to resume a few times before it gives up with
``max_output_tokens``; that is still a complete headless run as far as the gateway is concerned.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from areal.run.gateway_client import GatewayAdmin
from support import eventually

pytestmark = pytest.mark.serial  # each test runs the Claude Code CLI (a node process)

REPO = Path(__file__).resolve().parents[2]
CLAUDE = REPO / ".cache" / "npm" / "node_modules" / ".bin" / "claude"
INSTALL = (
    "make setup, which runs npm install --prefix .cache/npm "
    "@anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION) (the Makefile pins the version)"
)
RUN_TIMEOUT = 120.0  # seconds; a run takes ~1 s, so this only stops a hang


@pytest.fixture(scope="module")
def claude() -> str:
    if CLAUDE.is_file() and os.access(CLAUDE, os.X_OK):
        return str(CLAUDE)
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed, so the Claude Code CLI cannot be installed")
    pytest.skip(f"the Claude Code CLI is not installed at {CLAUDE}: run {INSTALL}")


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


def run_claude(claude: str, gateway: Any, tmp_path: Path, args: list[str], *, key_env: str) -> Run:
    """``claude -p "say hi" ARGS`` with only the environment it needs; killed (with anything it
    started) if it runs past RUN_TIMEOUT."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "TMPDIR": str(tmp_path),
        "ANTHROPIC_BASE_URL": gateway.url,
        key_env: gateway.key,
        "ANTHROPIC_MODEL": gateway.model,
        "ANTHROPIC_SMALL_FAST_MODEL": gateway.model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": gateway.model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "16",
        "CLAUDE_CODE_DISABLE_THINKING": "1",
        "MAX_THINKING_TOKENS": "0",
    }
    proc = subprocess.Popen(
        [claude, "-p", "say hi", *args],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"claude {' '.join(args)} did not finish within {RUN_TIMEOUT:.0f} s")
    return Run(proc.returncode, stdout, stderr)


def json_run(
    claude: str, gateway: Any, tmp_path: Path, args: list[str], *, key_env: str
) -> tuple[Run, str, dict[str, Any]]:
    """A ``--output-format json`` run under a new session id: the run, the id, its result."""
    session = str(uuid.uuid4())
    args = ["--output-format", "json", *args, "--session-id", session]
    run = run_claude(claude, gateway, tmp_path, args, key_env=key_env)
    return run, session, json.loads(run.stdout)


def log_lines(gateway: Any, session: str) -> list[str]:
    """The session's ``/v1/messages`` lines in gateway.log (Claude Code adds ``?beta=true``)."""
    text = (gateway.log_dir / "gateway.log").read_text()
    return [
        line
        for line in text.splitlines()
        if f" session={session} " in line and line.endswith(" path=/v1/messages")
    ]


def check_completed(run: Run, result: dict[str, Any]) -> None:
    """The run reported a result with no API error; only giving up on an untrained policy that
    never ends its turn is allowed as an unsuccessful ending."""
    assert result["type"] == "result", run.stderr
    assert result.get("api_error_status") is None, result
    if result["is_error"]:
        assert result.get("api_error") == "max_output_tokens", result
    else:
        assert run.returncode == 0, run.stderr
    assert result["usage"]["input_tokens"] > 0 and result["usage"]["output_tokens"] > 0


def test_headless_json_run(claude: str, gateway: Any, tmp_path: Path) -> None:
    run, session, result = json_run(
        claude,
        gateway,
        tmp_path,
        ["--bare", "--tools", ""],
        key_env="ANTHROPIC_AUTH_TOKEN",  # sent as Authorization: Bearer
    )
    check_completed(run, result)
    assert result["session_id"] == session
    lines = log_lines(gateway, session)  # grouped by Claude Code's own session header
    assert lines, (gateway.log_dir / "gateway.log").read_text()
    for line in lines:
        assert " status=200 " in line, line


def test_streamed_turns_are_recorded_once(claude: str, gateway: Any, tmp_path: Path) -> None:
    """Every call Claude Code makes is a complete stream (a broken one would make it repeat the
    call without streaming) and lands once in the RL session bound to its session id."""
    hint = str(uuid.uuid4())
    admin = GatewayAdmin(gateway.url, gateway.admin)
    session_id = asyncio.run(admin.open_session(hint=hint))["session_id"]
    run = run_claude(
        claude,
        gateway,
        tmp_path,
        [
            "--output-format",
            "stream-json",
            "--verbose",
            "--include-partial-messages",
            "--bare",
            "--tools",
            "",
            "--session-id",
            hint,
        ],
        key_env="ANTHROPIC_API_KEY",  # sent as x-api-key
    )
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
    check_completed(run, lines[-1])
    events = [e["event"] for e in lines if e.get("type") == "stream_event"]
    starts = [e for e in events if e["type"] == "message_start"]
    ends = [e for e in events if e["type"] == "message_delta"]
    assert starts and len(starts) == len(ends) == sum(e["type"] == "message_stop" for e in events)

    completions = gateway.state.sessions.get(session_id).completions
    # The client has its whole stream (and may exit) before the handler returns and the
    # middleware writes the request's gateway.log line: wait for the lines to catch up.
    eventually(
        lambda: len(log_lines(gateway, session_id)) >= len(starts),
        30,
        f"{len(starts)} gateway.log lines of the session",
    )
    assert len(completions) == len(starts) == len(log_lines(gateway, session_id))
    for completion, start, end in zip(completions, starts, ends, strict=True):
        assert len(completion.prompt_ids) == start["message"]["usage"]["input_tokens"]
        assert len(completion.output_ids) == end["usage"]["output_tokens"]


def test_default_prompt_is_refused_clearly(claude: str, gateway: Any, tmp_path: Path) -> None:
    _, session, result = json_run(claude, gateway, tmp_path, [], key_env="ANTHROPIC_API_KEY")
    assert result["is_error"] and result.get("api_error_status") == 400, result
    assert re.search(r"the prompt is \d+ tokens; the policy's context is 4096", result["result"])
    lines = log_lines(gateway, session)
    assert lines and all(" status=400 " in line for line in lines)
