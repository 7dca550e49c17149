"""``areal probe``: one episode of a real agent (the real ``openai`` SDK) through the real gateway
and nano engine of the adapters' conftest, explained: calls, model, merged or split turns (and
where the prefix broke), reward; nothing reaches the trainer (the session ends discarded)."""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

import areal
from areal.cli.main import main
from areal.run.probe import ProbeReport, probe
from areal.run.rollout import RolloutError

TASK = {"task_id": "p1", "question": "What is 1 plus 1?", "answer": "2"}


def run_probe(gateway: Any, agent: Any, **kw: Any) -> ProbeReport:
    adapter = areal.wrap(agent)
    return asyncio.run(
        probe(
            adapter.agent_fn,
            gateway_url=gateway.url,
            admin_token=gateway.admin,
            task=TASK,
            model=gateway.model,
            timeout_s=60,
            **kw,
        )
    )


def by_name(report: ProbeReport) -> dict[str, Any]:
    return {c.name: c for c in report.checks()}


async def two_turns(task: dict[str, Any], client: Any, model: str) -> float:
    """A well-behaved agent: turn 2 replays turn 1's conversation, so the turns merge."""
    messages = [{"role": "user", "content": task["question"]}]
    first = await client.chat.completions.create(model=model, messages=messages, max_tokens=4)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Are you sure?"},
    ]
    await client.chat.completions.create(model=model, messages=messages, max_tokens=4)
    return 0.5


async def rewrites_history(task: dict[str, Any], client: Any, model: str) -> None:
    """Turn 2 drops turn 1's answer and rewords the question: the prefix breaks."""
    await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": task["question"]}], max_tokens=4
    )
    await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Compute 1 + 1, please."}],
        max_tokens=4,
    )


def test_a_well_behaved_agent_gets_all_ok_and_trains_nothing(gateway: Any) -> None:
    report = run_probe(gateway, two_turns)
    checks = by_name(report)
    assert report.ok(), report.to_json()
    assert report.outcome == "finished" and report.reward == 0.5
    assert [c["status"] for c in report.calls] == [200, 200]
    assert {c["model"] for c in report.calls} == {gateway.model}
    # Turn 2 replays turn 1 exactly, so it merges: also when the untrained policy's sampled output
    # does not survive decode -> re-encode (split UTF-8 characters, newline runs), because the
    # gateway reuses the episode's tokens for the text they decode to (PolicyService.render).
    assert [t["join"] for t in report.turns] == ["start", "merged"]
    assert report.samples == 1 and checks["turns"].status == "ok"
    assert checks["model"].status == "ok" and "(the policy)" in checks["model"].detail
    assert gateway.trajectories() == []  # the probe's session ended discarded


def test_a_split_names_the_turn_and_the_token_where_the_prefix_broke(gateway: Any) -> None:
    report = run_probe(gateway, rewrites_history)
    split = report.turns[1]
    assert split["join"] == "split" and report.samples == 2
    # Both prompts start with the same template header; they part where the user text starts.
    assert 0 < split["diverged_at"] < split["prompt_tokens"]
    assert "Compute" in split["got"]["after"] and "What" in split["expected"]["after"]
    check = by_name(report)["turns"]
    assert check.status == "warn" and f"at token {split['diverged_at']}" in check.detail
    assert by_name(report)["reward"].status == "warn"  # returned None, set no reward


def test_an_agent_that_ignores_its_base_url_fails_the_probe(gateway: Any) -> None:
    async def hard_coded(task: dict[str, Any], client: Any) -> float:
        return 1.0  # never calls the client it was given

    report = run_probe(gateway, hard_coded)
    assert not report.ok()
    assert by_name(report)["base URL"].status == "fail"
    assert "ignores the base URL" in by_name(report)["base URL"].detail


def test_a_crashing_agent_reports_its_error(gateway: Any) -> None:
    async def crashes(task: dict[str, Any], client: Any, model: str) -> float:
        await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        raise KeyError("tool_result")

    report = run_probe(gateway, crashes)
    assert report.outcome == "failed" and "KeyError" in (report.error or "")
    assert by_name(report)["reward"].status == "fail"
    assert len(report.turns) == 1  # the trace was read before the session was discarded


AGENT_FILE = """
async def solve(task, client, model):
    messages = [{"role": "user", "content": task["question"]}]
    await client.chat.completions.create(model=model, messages=messages, max_tokens=3)
    return 1.0
"""


def test_the_cli_probes_an_agent_file_and_prints_json(
    gateway: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    (tmp_path / "my_agent.py").write_text(textwrap.dedent(AGENT_FILE))
    monkeypatch.setenv("AREAL_ADMIN_TOKEN", gateway.admin)
    argv = ["probe", f"{tmp_path}/my_agent.py:solve", "--gateway", gateway.url + "/v1", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["reward"] == 1.0 and len(report["turns"]) == 1
    assert [c["name"] for c in report["checks"]][:2] == ["base URL", "model"]


def test_the_cli_says_why_the_gateway_cannot_be_reached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    (tmp_path / "my_agent.py").write_text(textwrap.dedent(AGENT_FILE))
    monkeypatch.setenv("AREAL_ADMIN_TOKEN", "x" * 20)
    url = "http://127.0.0.1:9"  # discard port: nothing listens
    assert main(["probe", f"{tmp_path}/my_agent.py:solve", "--gateway", url]) == 1
    err = capsys.readouterr().err
    assert "nothing listens on 127.0.0.1:9" in err and "areal serve gateway" in err


def test_probe_without_the_admin_token_says_which_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.delenv("AREAL_ADMIN_TOKEN", raising=False)
    assert main(["probe", "claude_code"]) == 1
    assert "AREAL_ADMIN_TOKEN is not set" in capsys.readouterr().err


def test_rollout_errors_name_the_cause_when_the_gateway_is_down() -> None:
    async def agent(task: dict[str, Any], client: Any) -> float:
        return 0.0

    with pytest.raises(RolloutError, match=r"nothing listens on 127\.0\.0\.1:9"):
        asyncio.run(
            probe(areal.wrap(agent).agent_fn, gateway_url="http://127.0.0.1:9", admin_token="t")
        )
