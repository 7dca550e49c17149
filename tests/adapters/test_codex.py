"""The Codex CLI (npm ``@openai/codex``; ``make setup`` installs it into ``.cache/codex``) run
unchanged, with its default configuration, against the gateway's Responses API; and the Codex
adapter driving it through a real rollout worker.

What Codex 0.169.1 sends: one streamed ``/v1/responses`` call per model turn, its instructions as
two ``developer`` messages (~7.8k tokens in areal's BPE) and nine tools: seven function tools,
the ``multi_agent_v1`` namespace (five sub-agent functions inside) and ``web_search``. The gateway
offers the policy the function tools and leaves the two hosted ones out, naming them in
gateway.log; the prompt is then ~11.4k tokens, beyond the nano model's 4096. So the policy here
is :func:`turn_ending_model`, a nano model with a 32k context that ends every turn with a short
answer: Codex completes a turn only when the reply ends (a reply cut by the output cap fails the
turn).

Codex talks to nothing but the gateway on 127.0.0.1: HOME and CODEX_HOME are fresh directories,
the environment holds no proxy, and its update checks, analytics, feedback, OpenTelemetry
exporters and plugin sync are off (without them it looks up ab.chatgpt.com, chatgpt.com,
github.com and api.github.com; with them strace sees no lookup and no connection but the
gateway's). The tests that run the CLI stand for themselves; the rest use a stand-in executable
that records what the adapter gives the CLI.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from areal.adapters.claude_code import HarnessError
from areal.adapters.codex import (
    FULL_CONTEXT,
    KEY_ENV,
    CodexAdapter,
    CodexError,
    CodexTimeout,
    parse_events,
)
from areal.core.episode import Episode
from areal.core.tasks import TaskSet
from areal.host.http_server import ServerThread
from areal.plugins.inference.embedded.server import InferenceServer, build_server
from areal.plugins.models.hf_io import load_model, save_model
from areal.plugins.models.tiny import init_tiny
from areal.plugins.trainer import warm_start as warm_start_module
from areal.run.gateway_client import GatewayAdmin
from support import eventually
from support.cli import CODEX

pytestmark = pytest.mark.serial  # the CLI tests run Codex (a node launcher and a native binary)

CONTEXT = 32768  # the policy's context: Codex's default prompt is ~11.4k tokens
ANSWER = "ok"  # the turn-ending model's whole reply: one token, then <|im_end|>
HOSTED = "dropped_tools=namespace,web_search"  # Codex's hosted tools, left out of the prompt
RUN_TIMEOUT = 120.0  # seconds; a run takes ~2 s, so this only stops a hang
SECRET = "sk-areal-session-key-do-not-leak"


# --- the policy -----------------------------------------------------------------------------


def short_answer(index: int, seed: int) -> dict[str, Any]:
    """A demonstration: some instructions, a request, and the answer ``ok``."""
    rng = random.Random(f"codex-ok:{seed}:{index}")
    words = ["run", "the", "tests", "fix", "a", "bug", "read", "file", "say", "hi", "explain"]
    return {
        "messages": [
            {"role": "system", "content": " ".join(rng.choices(words, k=rng.randint(3, 20)))},
            {"role": "user", "content": " ".join(rng.choices(words, k=rng.randint(1, 8)))},
            {"role": "assistant", "content": ANSWER},
        ]
    }


ENDS_ITS_TURN = TaskSet("codex-ok", "answer ok", lambda i, s: {}, "-:-", short_answer)


def turn_ending_model(root: Path) -> Path:
    """The nano model with a ``CONTEXT``-token context, warm-started to answer ``ok`` and end
    its turn, at any prompt length.

    Its attention is switched off (value and output projections zero), so each next token depends
    on the current token alone: after the prompt's final ``assistant\\n`` comes ``ok``, then
    ``<|im_end|>``, whether the prompt is 12 tokens or 15k. With attention on, what a warm start
    teaches did not carry over to Codex's 11.4k-token prompt (measured, three seeds each): on
    short demonstrations one seed in three ended the turn (the others: P(ok) 0.0008, P(<|im_end|>)
    0.003); on 1-4k-token ones, in three recipes of four, one seed in three still did not, and
    they took 15-50 s to train. The two projections stay zero under training: each one's gradient
    is a product with the other. RoPE positions are computed, not tabulated, so the longer context
    is the config's number alone. 4-7 s to build on a busy core (the BPE tokenizer, then 20 steps
    of 4 demonstrations); P(ok) and P(<|im_end|>) > 0.99999.
    """
    source = root / "source"
    init_tiny(source, size="nano", seed=0)
    config_path = source / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "max_position_embeddings": CONTEXT}, indent=2))
    model = load_model(source)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.v_proj.weight.zero_()
            layer.self_attn.o_proj.weight.zero_()
    save_model(model, source)
    with pytest.MonkeyPatch.context() as patch:  # a task set of this module's, not a plugin's
        patch.setattr(warm_start_module, "find_task_set", lambda name: ENDS_ITS_TURN)
        return warm_start_module.warm_start(
            source, root / "model", task_set=ENDS_ITS_TURN.name, steps=20, batch_size=4,
            learning_rate=5e-2,
        )  # fmt: skip


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, InferenceServer]]:
    """This module's policy (the adapters' conftest gateway runs in front of it)."""
    path = turn_ending_model(tmp_path_factory.mktemp("codex-model"))
    server = build_server(str(path), max_total_tokens=2 * CONTEXT)
    http = ServerThread(server.app(), "127.0.0.1", 0).start()
    try:
        yield http.url, server
    finally:
        server.engine.stop()
        http.stop()


@pytest.fixture(scope="module")
def codex() -> str:
    return CODEX()


# --- the CLI, unchanged ---------------------------------------------------------------------


def default_config(base_url: str, model: str) -> str:
    """Codex's default configuration, plus only the gateway as its model provider and the
    switches of what would phone home."""
    return f"""\
model = "{model}"
model_provider = "areal"
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
trace_exporter = "none"
metrics_exporter = "none"

[features]
plugins = false

[model_providers.areal]
name = "areal"
base_url = "{base_url}"
env_key = "AREAL_SESSION_KEY"
wire_api = "responses"
"""


def run_codex(codex: str, gateway: Any, key: str, tmp_path: Path) -> str:
    """``codex exec --json say hi`` in fresh HOME, CODEX_HOME and workspace, with only the
    environment it needs; its stdout once it exits 0. Killed (with its children) past
    RUN_TIMEOUT."""
    home, work = tmp_path / "home", tmp_path / "work"
    (home / ".codex").mkdir(parents=True)
    work.mkdir()
    (home / ".codex" / "config.toml").write_text(default_config(f"{gateway.url}/v1", gateway.model))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "CODEX_HOME": str(home / ".codex"),
        "TMPDIR": str(tmp_path),
        "AREAL_SESSION_KEY": key,
    }
    argv = [codex, "exec", "--json", "--skip-git-repo-check", "say hi"]
    proc = subprocess.Popen(
        argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"codex exec did not finish within {RUN_TIMEOUT:.0f} s")
    assert proc.returncode == 0, f"stdout: {stdout[-2000:]}\nstderr: {stderr[-2000:]}"
    return stdout


def model_calls(gateway: Any, session_id: str) -> list[str]:
    """The session's gateway.log lines of model API calls (not the worker's /rl calls)."""
    text = (gateway.log_dir / "gateway.log").read_text()
    return [x for x in text.splitlines() if f" session={session_id} " in x and " path=/v1/" in x]


def test_exec_with_its_default_configuration_completes_a_turn(
    codex: str, gateway: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="areal.gateway.policy")
    admin = GatewayAdmin(gateway.url, gateway.admin)
    session = asyncio.run(admin.open_session())
    stdout = run_codex(codex, gateway, session["api_key"], tmp_path)

    events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert events[-1]["type"] == "turn.completed", events
    assert events[-1]["usage"]["input_tokens"] > 4096  # the whole default prompt was served
    said = [e["item"] for e in events if e["type"] == "item.completed"]
    assert [i["text"] for i in said if i["type"] == "agent_message"] == [ANSWER]

    # Every call is recorded before its stream ends, but its gateway.log line is written after
    # the client has the whole stream (and may have exited): wait for the lines to catch up.
    recorded = asyncio.run(admin.session(session["session_id"]))["completions"]
    assert recorded >= 1
    eventually(
        lambda: len(model_calls(gateway, session["session_id"])) >= recorded,
        30,
        f"{recorded} gateway.log lines of the session",
    )
    lines = model_calls(gateway, session["session_id"])
    assert len(lines) == recorded
    for line in lines:
        assert line.endswith(" path=/v1/responses") and " status=200 " in line, line
        assert f" {HOSTED} " in line, line
    warned = "\n".join(r.getMessage() for r in caplog.records)
    assert "a 'namespace' tool was left out" in warned and "a 'web_search' tool" in warned


# --- the adapter ----------------------------------------------------------------------------


def test_an_episode_runs_through_the_gateway(codex: str, gateway: Any) -> None:
    adapter = CodexAdapter(binary=codex, reward_command="test -f notes.txt", timeout_s=120.0)
    tasks = [{"task_id": "hi", "prompt": "say hi", "files": {"notes.txt": "a note\n"}}]
    stats, got = gateway.run(adapter, tasks)
    assert (stats.started, stats.finished) == (1, 1), stats.to_json()
    assert stats.rewards == [1.0]  # the workspace held the task's file when scored
    trajectory = got["hi"]
    assert trajectory.reward == 1.0 and trajectory.completions == len(trajectory.turns) >= 1
    calls = trajectory.completions
    eventually(
        lambda: len(model_calls(gateway, trajectory.session_id)) >= calls,
        30,
        f"{calls} gateway.log lines of the episode",
    )
    lines = model_calls(gateway, trajectory.session_id)
    assert len(lines) == calls
    assert all(" status=200 " in x and x.endswith(" path=/v1/responses") for x in lines), lines


def episode(task: dict[str, Any]) -> Episode:
    """An episode for runs that never reach a gateway (stand-ins and early failures)."""
    return Episode(
        task=task, base_url="http://127.0.0.1:9/v1", api_key=SECRET, model="areal-nano",
        max_turns=3, session_id="sess-1",
    )  # fmt: skip


def stand_in(tmp_path: Path, body: str) -> str:
    """An executable standing in for ``codex``: it records its argv, cwd, environment, files and
    config in ``$DUMP``, then runs ``body`` (Python)."""
    path = tmp_path / "codex"
    path.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "config = open(os.path.join(os.environ['CODEX_HOME'], 'config.toml')).read()\n"
        "record = {'argv': sys.argv, 'cwd': os.getcwd(), 'env': dict(os.environ),\n"
        "          'files': sorted(os.listdir('.')), 'config': config}\n"
        "open(os.environ['DUMP'], 'w').write(json.dumps(record))\n"
        "def say(*events):\n"
        "    for e in events: print(json.dumps(e))\n" + body
    )
    path.chmod(0o755)
    return str(path)


ANSWERED = (
    "say({'type': 'item.completed', 'item': {'type': 'error', 'message': 'metadata notice'}},\n"
    "    {'type': 'item.completed', 'item': {'type': 'agent_message', 'text': 'Done.'}},\n"
    "    {'type': 'turn.completed', 'usage': {}})\n"
)


def test_the_cli_gets_the_default_configuration_and_only_its_own_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "the-machines-key")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    dump = tmp_path / "dump.json"
    (tmp_path / "episodes").mkdir()
    adapter = CodexAdapter(
        binary=stand_in(tmp_path, ANSWERED),
        env={"DUMP": str(dump)},
        work_root=str(tmp_path / "episodes"),
    )
    ep = episode({"prompt": "-fix it", "files": {"src/a.py": "x = 1\n"}})
    assert asyncio.run(adapter.agent_fn(ep)) == "Done."
    record = json.loads(dump.read_text())
    env, argv = record["env"], record["argv"]

    home = Path(env["HOME"])
    assert home.parent.parent == tmp_path / "episodes" and env["CODEX_HOME"] == str(home / ".codex")
    assert record["cwd"] == str(home.parent / "work") and record["files"] == ["src"]
    assert not any((tmp_path / "episodes").iterdir())  # the episode's directory is gone
    assert argv[1:] == [
        "exec", "--json", "--skip-git-repo-check", "--sandbox", "workspace-write", "--", "-fix it",
    ]  # fmt: skip
    assert env[KEY_ENV] == SECRET and SECRET not in record["config"] + " ".join(argv)
    assert "OPENAI_API_KEY" not in env and "HTTPS_PROXY" not in env and env["NO_PROXY"] == "*"
    own = {"HOME", "CODEX_HOME", "TMPDIR", KEY_ENV, "NO_PROXY"}
    added = {"PWD", "SHLVL", "_", "LC_CTYPE"}  # what the OS or Python may add
    assert set(env) - {"DUMP", "PATH", "LANG", "LC_ALL", "TZ"} <= own | added
    # The test above runs Codex with this very configuration; the adapter adds only no-retries.
    written = tomllib.loads(record["config"])
    provider = written["model_providers"]["areal"]
    assert (provider.pop("request_max_retries"), provider.pop("stream_max_retries")) == (0, 0)
    assert written == tomllib.loads(default_config(ep.base_url, ep.model))


def test_the_final_workspace_or_text_is_scored(tmp_path: Path) -> None:
    """What the CLI leaves in the workspace is what the reward command sees (without the key);
    a registered reward scores the last agent message."""
    body = "open('answer.txt', 'w').write(open('question.txt').read().split()[-1])\n" + ANSWERED
    options: dict[str, Any] = {
        "binary": stand_in(tmp_path, body),
        "env": {"DUMP": str(tmp_path / "d")},
    }
    command = f'grep -qx 42 answer.txt && [ -z "${KEY_ENV}" ]'
    by_test = CodexAdapter(options, reward_command=command)
    by_name = CodexAdapter(options, reward="exact_match")
    silent = CodexAdapter(options, answer=False)

    def run(adapter: CodexAdapter, task: dict[str, Any]) -> Any:
        return asyncio.run(adapter.agent_fn(episode(task)))

    assert run(by_test, {"prompt": "p", "files": {"question.txt": "six times seven is 42"}}) == 1.0
    assert run(by_test, {"prompt": "p", "files": {"question.txt": "or 41"}}) == 0.0
    assert run(by_name, {"prompt": "p", "answer": "Done.", "files": {"question.txt": "1"}}) == 1.0
    assert run(silent, {"prompt": "p", "files": {"question.txt": "1"}}) is None
    with pytest.raises(HarnessError, match="no 'prompt' text"):
        run(silent, {"files": {}})


def test_failures_are_clear_errors(tmp_path: Path) -> None:
    missing = CodexAdapter(binary=str(tmp_path / "no-such-codex"))
    with pytest.raises(CodexError, match=r"was not found: install it with `make setup`"):
        asyncio.run(missing.agent_fn(episode({"prompt": "p"})))
    hang = stand_in(tmp_path, "import threading; threading.Event().wait()\n")  # never ends
    stuck = CodexAdapter(binary=hang, env={"DUMP": str(tmp_path / "d")}, timeout_s=0.5)
    with pytest.raises(CodexTimeout, match="process group was killed"):
        asyncio.run(stuck.agent_fn(episode({"prompt": "p"})))
    with pytest.raises(ValueError, match="sandbox must be one of"):
        CodexAdapter(sandbox="none")
    with pytest.raises(ValueError, match=r"unknown codex option\(s\) \['tools'\]"):
        CodexAdapter(tools=[])


RAN_A_COMMAND = json.dumps({"type": "item.completed", "item": {"type": "command_execution"}}) + "\n"


def failed(message: str) -> str:
    return json.dumps({"type": "turn.failed", "error": {"message": message}})


@pytest.mark.parametrize(
    ("stdout", "code", "expected"),
    [
        (json.dumps({"type": "turn.completed"}), 0, ""),
        (failed("Incomplete response returned, reason: max_output_tokens"), 1, ""),
        (RAN_A_COMMAND + failed(f"Codex {FULL_CONTEXT}. Start a new thread or ..."), 1, ""),
        (
            failed(f"Codex {FULL_CONTEXT}. Start a new thread or ..."),
            1,
            "first prompt does not fit",
        ),
        (failed(f"unexpected status 401 Unauthorized: bad key {SECRET}"), 1, "the turn failed"),
        ("Error loading config.toml", 1, "exited with code 1"),
        ("", 0, "printed no turn.completed event"),
    ],
)
def test_codex_events_are_answers_or_clear_errors(stdout: str, code: int, expected: str) -> None:
    """Codex's own endings as 0.169.1 prints them; the policy's endings are empty answers."""
    if code == 0 and expected == "":
        message = {"type": "item.completed", "item": {"type": "agent_message", "text": "hi"}}
        assert parse_events(json.dumps(message) + "\n" + stdout, "", 0, secret=SECRET) == "hi"
    elif expected == "":
        assert parse_events(stdout, "", code, secret=SECRET) == ""
    else:
        with pytest.raises(CodexError, match=expected) as caught:
            parse_events(stdout, f"stderr with {SECRET}", code, secret=SECRET)
        assert SECRET not in str(caught.value)
