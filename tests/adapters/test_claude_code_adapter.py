"""The Claude Code adapter: the real CLI (``make setup`` installs it into ``.cache/npm``) driven
by a rollout worker against a real gateway and nano engine on 127.0.0.1 (the adapters' conftest),
plus a stand-in executable that records the environment and arguments the adapter gives the CLI.

The nano policy cannot handle Claude Code's default ~35k-token prompt, so the real runs use the
adapter's defaults (``--bare``, no tools) and a 16-token output cap: the untrained policy never
ends its turn, and Claude Code gives up after a few resumptions, which is still a finished
episode whose calls the gateway records. The tests that run the real CLI are in the serial
tier.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from areal.adapters.claude_code import (
    MODEL_ENV,
    ClaudeCodeAdapter,
    ClaudeCodeError,
    ClaudeCodeTimeout,
    claude_session_id,
    parse_result,
)
from areal.core.episode import Episode
from areal.run.rollout import RolloutWorker
from support import eventually
from support.cli import CLAUDE_CODE

POLICY = "areal-nano"  # the conftest gateway's policy
SECRET = "sk-areal-session-key-do-not-leak"
FAST: dict[str, Any] = {"max_output_tokens": 16, "timeout_s": 120.0}


@pytest.fixture(scope="module")
def claude() -> str:
    return CLAUDE_CODE()


def episode(task: dict[str, Any], **fields: Any) -> Episode:
    """An episode for runs that never reach a gateway (stand-ins and early failures)."""
    values: dict[str, Any] = {
        "task": task,
        "base_url": "http://127.0.0.1:9/v1",
        "api_key": SECRET,
        "model": POLICY,
        "max_turns": 3,
        "session_id": "sess-1",
    }
    return Episode(**(values | fields))


def stand_in(tmp_path: Path, body: str) -> str:
    """An executable standing in for ``claude``: it records its argv, cwd and environment in
    ``$DUMP`` and runs ``body`` (Python)."""
    path = tmp_path / "claude"
    path.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "record = {'argv': sys.argv, 'cwd': os.getcwd(), 'env': dict(os.environ),\n"
        "          'files': sorted(os.listdir('.'))}\n"
        "open(os.environ['DUMP'], 'w').write(json.dumps(record))\n" + body
    )
    path.chmod(0o755)
    return str(path)


@pytest.mark.serial
def test_episodes_run_through_the_gateway_and_are_recorded(claude: str, gateway: Any) -> None:
    adapter = ClaudeCodeAdapter(
        binary=claude, reward_command="test -f notes.txt && ! test -e absent.txt", **FAST
    )
    tasks = [{"task_id": "hi", "prompt": "say hi", "files": {"notes.txt": "a note\n"}}]
    worker = RolloutWorker(
        gateway.url, gateway.admin, adapter, model=POLICY, concurrency=2, max_turns=4
    )
    stats = asyncio.run(worker.run(tasks, n_samples_per_task=2))
    assert (stats.started, stats.finished, stats.sent) == (2, 2, 2), stats.to_json()
    assert stats.rewards == [1.0, 1.0]  # the workspace held the task's file when scored
    got = gateway.trajectories()
    assert len(got) == 2 and len({t.session_id for t in got}) == 2
    for t in got:
        assert t.completions >= 1 and t.reward == 1.0
        # every call was made with the episode's key, so all landed in its own session
        assert t.completions == len(t.turns)
    log = (gateway.log_dir / "gateway.log").read_text()
    for t in got:
        lines = [x for x in log.splitlines() if f" session={t.session_id} " in x]
        assert lines and all(" status=200 " in x for x in lines if "/v1/messages" in x)


@pytest.mark.serial
def test_the_final_text_is_returned_for_the_workers_reward(
    claude: str, gateway: Any, tmp_path: Path
) -> None:
    """The untrained policy never ends its turn, so its answer is empty; Claude Code kept its
    state in the episode's own HOME, never the machine's."""
    seen: list[str] = []

    def reward_fn(*, completion: str, task: Any) -> float:
        seen.append(completion)
        return 0.5

    worker = RolloutWorker(
        gateway.url,
        gateway.admin,
        ClaudeCodeAdapter(binary=claude, keep_workdir=True, work_root=str(tmp_path), **FAST),
        reward_fn=reward_fn,
        model=POLICY,
    )
    stats = asyncio.run(worker.run([{"prompt": "say hi"}]))
    assert (stats.finished, stats.rewards) == (1, [0.5]), stats.to_json()
    assert seen == [""]
    (kept,) = tmp_path.glob("areal-claude-*")
    assert (kept / "home" / ".claude" / ".claude.json").is_file()
    assert [p.name for p in (kept / "work").iterdir()] == []


def test_the_cli_gets_an_isolated_home_and_only_its_own_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "the-machines-oauth-token")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    dump = tmp_path / "dump.json"
    stand_in(tmp_path, "print(json.dumps({'type': 'result', 'result': 'done'}))\n")  # ./claude
    monkeypatch.chdir(tmp_path)
    adapter = ClaudeCodeAdapter(
        binary="./claude",  # relative to the caller's directory, not the workspace
        env={"DUMP": str(dump)},
        work_root=str(tmp_path / "episodes"),
        allowed_tools=["Bash", "Edit"],
        max_output_tokens=64,
    )
    (tmp_path / "episodes").mkdir()
    ep = episode({"prompt": "fix it", "files": {"src/a.py": "x = 1\n"}})
    assert asyncio.run(adapter.agent_fn(ep)) == "done"
    record = json.loads(dump.read_text())
    env, argv = record["env"], record["argv"]

    home = Path(env["HOME"])
    assert home != Path.home() and home.parent.parent == tmp_path / "episodes"
    assert record["cwd"] == str(home.parent / "work") and record["files"] == ["src"]
    assert not (tmp_path / "episodes").exists() or not any((tmp_path / "episodes").iterdir())
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9"  # Claude Code adds /v1 itself
    assert env["ANTHROPIC_API_KEY"] == SECRET
    assert "ANTHROPIC_AUTH_TOKEN" not in env and "HTTPS_PROXY" not in env
    assert {env[name] for name in MODEL_ENV} == {POLICY}
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["DISABLE_TELEMETRY"] == env["CLAUDE_CODE_DISABLE_THINKING"] == "1"
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "64"
    assert set(env) - {"DUMP", "PATH", "LANG", "LC_ALL", "TZ"} <= {
        *MODEL_ENV,
        "HOME",
        "CLAUDE_CONFIG_DIR",
        "TMPDIR",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_API_KEY",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
        "DISABLE_TELEMETRY",
        "DISABLE_ERROR_REPORTING",
        "DISABLE_AUTOUPDATER",
        "NO_PROXY",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS",
        "CLAUDE_CODE_DISABLE_THINKING",
        "MAX_THINKING_TOKENS",
    } | {"PWD", "SHLVL", "_", "LC_CTYPE"}  # what the OS or Python may add
    assert argv[1:3] == ["-p", "fix it"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert flags["--output-format"] == "json" and flags["--max-turns"] == "3"
    assert flags["--session-id"] == claude_session_id(ep) == str(uuid.UUID(flags["--session-id"]))
    assert "--bare" in argv and argv[argv.index("--tools") + 1] == ""
    assert argv[argv.index("--allowedTools") + 1] == "Bash,Edit"


def test_a_non_zero_exit_names_the_code_and_hides_the_key(tmp_path: Path) -> None:
    body = "sys.stderr.write('auth failed for ' + os.environ['ANTHROPIC_API_KEY']); sys.exit(3)\n"
    adapter = ClaudeCodeAdapter(binary=stand_in(tmp_path, body), env={"DUMP": str(tmp_path / "d")})
    with pytest.raises(ClaudeCodeError, match="exited with code 3") as caught:
        asyncio.run(adapter.agent_fn(episode({"prompt": "x"})))
    assert "auth failed for <session key>" in str(caught.value)
    assert SECRET not in str(caught.value)


@pytest.mark.serial
def test_failures_become_failed_episodes_with_clear_errors(
    claude: str, gateway: Any, tmp_path: Path
) -> None:
    marker = f"hang-{uuid.uuid4().hex}"
    adapters = {
        "missing": ClaudeCodeAdapter(binary=str(tmp_path / "no-such-claude")),
        "bad flag": ClaudeCodeAdapter(binary=claude, extra_args=["--no-such-flag"]),
        "timeout": ClaudeCodeAdapter(binary=claude, timeout_s=0.3),
    }
    errors: dict[str, BaseException] = {}

    async def agent(ep: Episode) -> float | str | None:
        try:
            return await adapters[ep.task["case"]].agent_fn(ep)
        except Exception as err:
            errors[ep.task["case"]] = err
            raise

    tasks = [{"case": case, "prompt": f"say hi {marker}"} for case in adapters]
    worker = RolloutWorker(gateway.url, gateway.admin, agent, model=POLICY, concurrency=3)
    stats = asyncio.run(worker.run(tasks))
    assert (stats.started, stats.failed, stats.timed_out, stats.finished) == (3, 2, 1, 0)
    assert dict(stats.errors) == {"ClaudeCodeError": 2, "TimeoutError": 1}
    assert "was not found" in str(errors["missing"]) and "make setup" in str(errors["missing"])
    assert "exited with code 1" in str(errors["bad flag"])
    assert "no-such-flag" in str(errors["bad flag"])  # the tail of stderr says what was wrong
    assert isinstance(errors["timeout"], ClaudeCodeTimeout)
    assert "process group was killed" in str(errors["timeout"])
    eventually(lambda: not list(_pids_with(marker)), 60, "the timed-out CLI's processes gone")


def _pids_with(text: str) -> Iterator[int]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in cmdline and int(entry.name) != os.getpid():
                yield int(entry.name)


def test_the_final_workspace_or_text_is_scored(tmp_path: Path) -> None:
    """The template and the task's files make the workspace; what the CLI leaves there is what
    the reward command sees (without the session key); a registered reward scores the text."""
    template = tmp_path / "template"
    (template / "tests").mkdir(parents=True)
    (template / "tests" / "check.sh").write_text('grep -qx 42 answer.txt && [ -z "$KEYS" ]\n')
    body = (
        "open('answer.txt', 'w').write(open('question.txt').read().split()[-1] + '\\n')\n"
        "print(json.dumps({'type': 'result', 'result': 'Done.', 'is_error': False}))\n"
    )
    options: dict[str, Any] = {
        "binary": stand_in(tmp_path, body),
        "env": {"DUMP": str(tmp_path / "d"), "KEYS": ""},
        "workspace": str(template),
    }
    command = "KEYS=$ANTHROPIC_API_KEY$ANTHROPIC_AUTH_TOKEN sh tests/check.sh"
    by_test = ClaudeCodeAdapter(options, reward_command=command)
    by_name = ClaudeCodeAdapter(options, reward="exact_match")
    silent = ClaudeCodeAdapter(options, answer=False)

    def run(adapter: ClaudeCodeAdapter, task: dict[str, Any]) -> Any:
        return asyncio.run(adapter.agent_fn(episode(task)))

    assert run(by_test, {"prompt": "p", "files": {"question.txt": "six times seven is 42"}}) == 1.0
    assert run(by_test, {"prompt": "p", "files": {"question.txt": "or 41"}}) == 0.0
    own = {"prompt": "p", "files": {"question.txt": "41"}, "reward_command": "true"}
    assert run(by_test, own) == 1.0  # a task's own command wins over the adapter's
    assert run(by_name, {"prompt": "p", "answer": "done", "files": {"question.txt": "1"}}) == 1.0
    assert run(by_name, {"prompt": "p", "answer": "no", "files": {"question.txt": "1"}}) == 0.0
    assert run(silent, {"prompt": "p", "files": {"question.txt": "1"}}) is None
    with pytest.raises(ClaudeCodeError, match="outside the workspace"):
        run(silent, {"prompt": "p", "files": {"../escape.txt": "x"}})
    with pytest.raises(ClaudeCodeError, match="no 'prompt' text"):
        run(silent, {"files": {}})


@pytest.mark.parametrize(
    ("result", "code", "expected"),
    [
        ({"subtype": "success", "is_error": False, "result": "hi"}, 0, "hi"),
        ({"subtype": "error_max_turns", "is_error": True}, 1, ""),  # the policy's ending
        ({"is_error": True, "api_error": "max_output_tokens", "result": "API Error: ..."}, 1, ""),
        ({"is_error": True, "api_error_status": 400, "result": "prompt too long"}, 1, "HTTP 400"),
        ({"subtype": "error_during_execution", "is_error": True}, 1, "error_during_execution"),
        ({"subtype": "success", "is_error": False, "result": "hi"}, 2, "exited with code 2"),
    ],
)
def test_results_of_the_cli_are_answers_or_clear_errors(
    result: dict[str, Any], code: int, expected: str
) -> None:
    stdout = json.dumps({"type": "result", **result})
    if not result.get("is_error") and not code:
        assert parse_result(stdout, "", code, secret=SECRET) == expected
    elif expected == "":
        assert parse_result(stdout, "", code, secret=SECRET) == ""
    else:
        with pytest.raises(ClaudeCodeError, match=expected):
            parse_result(stdout, "", code, secret=SECRET)
    with pytest.raises(ClaudeCodeError, match="printed no JSON result"):
        parse_result("Hello", "", 0, secret=SECRET)
