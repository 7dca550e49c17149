"""``scripts/launch_async.sh``, the seed article's two-step launch: it parses, and the commands it
runs are the article's, with flags the real entry points accept. (Running the whole script is a
test of its own once training attaches to the gateway it starts.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "launch_async.sh"
GATEWAY = (
    '"$PYTHON" -m areal.gateway.server --config configs/taotoken_router.yaml --port 9000 '
    "--log-level info &"
)
TRAIN = (
    '"$PYTHON" -m areal.train --config configs/agent_async_train.yaml --agent-config '
    'agent_config.py --output-dir ./checkpoints/run_001 "$@"'
)
TOKEN = "import secrets;print(secrets.token_hex(16))"


def script_lines() -> list[str]:
    return [line.strip() for line in SCRIPT.read_text().splitlines()]


def test_the_script_is_executable_bash_that_parses() -> None:
    assert os.access(SCRIPT, os.X_OK)
    lines = script_lines()
    assert lines[0] == "#!/usr/bin/env bash" and "set -euo pipefail" in lines
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_it_runs_the_articles_two_commands_in_order() -> None:
    lines = script_lines()
    assert 'PYTHON="${PYTHON:-python}"' in lines  # PYTHON=.venv/bin/python works
    assert GATEWAY in lines and TRAIN in lines
    assert lines.index(GATEWAY) < lines.index("trap stop_gateway EXIT") < lines.index(TRAIN)
    text = SCRIPT.read_text()
    wait = re.search(r'GATEWAY_URL="([^"]+)"', text)
    assert wait is not None and wait.group(1) == "http://127.0.0.1:9000/gateway/v1/models"
    assert 'until curl -s -o /dev/null --max-time 2 "$GATEWAY_URL"; do' in lines
    for path in ("configs/taotoken_router.yaml", "configs/agent_async_train.yaml"):
        assert (ROOT / path).is_file(), path
    assert (ROOT / "agent_config.py").is_file()


def test_the_admin_token_is_made_only_when_unset() -> None:
    text = SCRIPT.read_text()
    assert 'if [[ -z "${AREAL_ADMIN_TOKEN:-}" ]]; then' in text
    assert f'AREAL_ADMIN_TOKEN="$("$PYTHON" -c \'{TOKEN}\')"' in text
    assert "export AREAL_ADMIN_TOKEN" in script_lines()
    token = subprocess.run([sys.executable, "-c", TOKEN], capture_output=True, text=True)
    assert re.fullmatch(r"[0-9a-f]{32}\n", token.stdout)


def test_the_flags_are_the_entry_points_own() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for module, command in (("areal.gateway.server", GATEWAY), ("areal.train", TRAIN)):
        result = subprocess.run(
            [sys.executable, "-m", module, "--help"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        for flag in re.findall(r"(--[a-z-]+)", command):
            assert flag in result.stdout, (module, flag)
