"""``areal train`` on online agents alone (``async.rollout_workers: 0``, ``agent.online``): the
quickstart on the nano model, no rollout worker; agents deployed elsewhere call the run's gateway
with the plain key through the real ``openai`` and ``anthropic`` SDKs, some naming their group,
some not; their operator rates the conversations; the trainer takes a real step on them, and the
run's audit trail, episode journal and gateway log name every one."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from areal.core.episode_journal import EpisodeBooks, read_journal
from areal.host.process import pick_free_port
from areal.run.accounting import JOURNAL_NAME
from areal.run.runner import RunError, train
from support import eventually
from support.http import group_metadata
from support.runs import ROOT, command, jsonl, make_config, trained

pytestmark = pytest.mark.serial

KEY = "areal-online-test-key"
TOKENS = 6
MODEL = "policy"  # the run's policy model id (its router config)


def online_run(out: Path, port: int) -> list[str]:
    """One step of 4 episodes, all of them online conversations."""
    return command(
        out,
        1,
        (
            "warm_start.steps=0",
            "model.init_tiny=nano",
            "async.rollout_workers=0",
            "agent.online.enabled=true",
            f"agent.online.port={port}",
            "async.trigger_batch_size=4",
            "train.global_batch_size=4",
            "train.mini_batch_size=4",
            "algorithm.group_size=2",
            "agent.concurrency=4",
            f"sampling.max_new_tokens={TOKENS}",
        ),
        resume=False,
    )


def test_an_online_only_run_trains_on_rated_conversations(tmp_path: Path) -> None:
    out, port = tmp_path / "out", pick_free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "AREAL_GATEWAY_KEY": KEY}
    out.mkdir()
    with open(out / "areal-train.log", "wb") as log:
        run = subprocess.Popen(online_run(out, port), cwd=ROOT, env=env, stdout=log, stderr=log)
    try:
        sessions = converse(url, run)
        code = run.wait(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    output = (out / "areal-train.log").read_text(errors="replace")
    assert code == 0, output[-4000:]

    # A real step, on these four conversations: both groups teach (neither is flat).
    (step,) = [e for e in jsonl(out / "logs" / "metrics.jsonl") if e.get("event") == "train"]
    assert step["grad_norm"] > 0, step
    assert (step["groups"], step["flat_groups"]) == (2, 0), step
    assert step["trajectories"] == 4 and step["updated"] >= 4, step
    # The audit trail: each conversation trained once, at step 1, in its group.
    audit = {r["conversation"]: r for r in trained(out)}
    assert {c: r["session_id"] for c, r in audit.items()} == sessions
    assert {r["step"] for r in audit.values()} == {1}
    assert audit["chat-a"]["group"] == audit["claude-b"]["group"] == "online:pair"
    pooled = audit["responses-c"]["group"]
    assert pooled.startswith("online~pool-") and audit["chat-d"]["group"] == pooled
    # The episode journal and the gateway's access log name them too.
    books = EpisodeBooks()
    read_journal(out / "run" / JOURNAL_NAME, books)
    assert (books.started, books.accepted, books.rejected) == (4, 4, 0)
    gateway_log = (out / "logs" / "gateway.log").read_text()
    assert all(f"session={sid}" in gateway_log for sid in sessions.values())
    assert "online agents: base URL" in output


def converse(url: str, run: subprocess.Popen[bytes]) -> dict[str, str]:
    """Four conversations, rated: a named pair (openai chat, two turns; anthropic messages),
    and two that name no group (openai responses and chat), pooled by default. Returns each
    conversation's session id."""

    def up() -> bool:
        assert run.poll() is None, "areal train exited before its gateway came up"
        return httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}).is_success

    eventually(up, 240, "the run's gateway to serve online agents")
    sessions = {}
    with (
        openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60) as client,
        anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=60) as claude,
    ):
        pair = {"x-areal-conversation": "chat-a", "x-areal-group": "pair"}
        messages: list[Any] = [{"role": "user", "content": "2+2?"}]
        first = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=messages,
            max_tokens=TOKENS,
            extra_headers=pair,  # type: ignore[arg-type]
        )
        messages += [{"role": "assistant", "content": first.parse().choices[0].message.content}]
        messages += [{"role": "user", "content": "sure?"}]
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=TOKENS,
            extra_headers=pair,  # type: ignore[arg-type]
        )
        sessions["chat-a"] = first.headers["x-areal-session"]
        message = claude.messages.with_raw_response.create(
            model=MODEL,
            max_tokens=TOKENS,
            messages=[{"role": "user", "content": "2+2?"}],
            metadata=group_metadata("pair"),
            extra_headers={"x-areal-conversation": "claude-b"},
        )
        sessions["claude-b"] = message.headers["x-areal-session"]
        response = client.responses.with_raw_response.create(
            model=MODEL,
            input="3+3?",
            max_output_tokens=TOKENS,
            extra_headers={"x-areal-conversation": "responses-c"},
        )
        sessions["responses-c"] = response.headers["x-areal-session"]
        alone = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": "4+4?"}],
            max_tokens=TOKENS,
            extra_headers={"x-areal-conversation": "chat-d"},
        )
        sessions["chat-d"] = alone.headers["x-areal-session"]
        # The operator rates them: by conversation, or by the id an answer came with.
        rate(url, "/conversations/chat-a/end", {"reward": 1.0})
        rate(url, f"/completions/{message.parse().id}/reward", {"reward": 0.0})
        rate(url, "/conversations/claude-b/end", {})
        rate(url, "/conversations/responses-c/end", {"reward": 1.0})
        rate(url, "/conversations/chat-d/end", {"reward": -1.0})
    return sessions


def rate(url: str, path: str, body: dict[str, Any]) -> None:
    answer = httpx.post(
        f"{url}/rl{path}", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60
    )
    assert answer.status_code == 200, answer.text
    assert json.loads(answer.text)["status"] in ("open", "ended"), answer.text


def test_an_online_run_without_the_gateway_key_stops_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Online agents must know the key before the run starts: unset, one line says so, before
    any engine or model is built."""
    monkeypatch.delenv("AREAL_GATEWAY_KEY", raising=False)
    config = make_config(
        tmp_path, **{"async": {"rollout_workers": 0}}, agent={"online": {"enabled": True}}
    )
    with pytest.raises(RunError, match="export AREAL_GATEWAY_KEY="):
        train(config, tmp_path / "out")
    assert not (tmp_path / "model").exists()
