"""``vercel_ai``: the Vercel AI SDK (npm ``ai`` 7 with ``@ai-sdk/openai`` and ``@ai-sdk/anthropic``),
unmodified, in Node scripts run by the adapter as episodes of a real rollout worker against the real
gateway and nano engine.

Each protocol the SDK speaks (OpenAI Chat Completions, OpenAI Responses, Anthropic Messages) runs
every case of ``vercel_ai/run.mjs`` in one Node process: a plain and a streamed reply, forced tool
calls (``toolChoice: 'required'`` and a named tool, one streamed), a tool round trip (the SDK runs
the tool and sends its result back), and structured output (``Output.object``, ``generateObject``,
``streamObject``, JSON mode). The untrained policy writes noise, so what is checked is the protocol:
the SDK parsed each reply, tool inputs and objects satisfy their schemas (checked again here with
``jsonschema``), and every call landed in the episode's session.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from areal.adapters.vercel_ai import VercelAIAdapter, VercelAIError, parse_output
from support.cli import NODE24, vercel_ai_sdk
from support.sockets import is_loopback
from support.tool_schemas import ARGS, FLIP

pytestmark = pytest.mark.serial  # each episode starts a Node process

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).with_name("vercel_ai")
# The schemas of run.mjs's zod objects, as the SDK sends them (ARGS and FLIP: support.tool_schemas).
ANSWER = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
        "ok": {"type": "boolean"},
        "color": {"type": "string", "enum": ["red", "blue"]},
    },
    "required": ["n", "ok", "color"],
    "additionalProperties": False,
}
VERDICT = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "color": {"type": "string", "enum": ["red", "blue"]}},
    "required": ["ok", "color"],
    "additionalProperties": False,
}
# Model calls per run of run.mjs: one per case, two for the round trip.
CALLS = 12


@pytest.fixture(scope="module")
def ai_sdk() -> None:
    vercel_ai_sdk()


def valid(instance: Any, schema: dict[str, Any]) -> bool:
    jsonschema.validate(instance, schema)
    return True


def check(case: str, got: dict[str, Any]) -> None:
    """What each case of run.mjs must have returned."""
    finished = ("length", "stop")
    if case == "plain":
        assert isinstance(got["text"], str) and got["finishReason"] in finished
        assert got["outputTokens"] <= 8
    elif case == "stream":
        # However many pieces the text came in (bytes of one character arrive together).
        assert "".join(got["deltas"]) == got["text"] and got["finishReason"] in finished
    elif case == "forced_required":
        assert got["finishReason"] == "tool-calls" and len(got["toolCalls"]) == 1
        assert got["toolCalls"][0]["toolName"] == "calc"
        assert valid(got["toolCalls"][0]["input"], ARGS)
    elif case == "forced_named":
        assert got["finishReason"] == "tool-calls"
        assert [c["toolName"] for c in got["toolCalls"]] == ["flip"]
        assert valid(got["toolCalls"][0]["input"], FLIP)
    elif case == "tool_round_trip":
        first, second = got["steps"]  # the tool's step, then the answer: two calls
        assert first["finishReason"] == "tool-calls" and valid(got["ran"][0], ARGS)
        assert [c["input"] for c in first["toolCalls"]] == got["ran"]  # the SDK ran the call
        assert first["toolResults"] == [{"result": 4242}]
        assert second["toolCalls"] == [] and second["finishReason"] in finished
        assert "4242" in got["secondRequest"]  # the result went back to the gateway
    elif case == "stream_tool":
        assert {"tool-input-delta", "tool-call"} <= set(got["parts"])
        assert got["finishReason"] == "tool-calls" and len(got["toolCalls"]) == 1
        assert valid(got["toolCalls"][0]["input"], ARGS)
    elif case in ("output_object", "stream_output_object"):
        assert got["finishReason"] == "stop" and valid(got["output"], ANSWER)
    elif case in ("generate_object", "stream_object"):
        assert got["finishReason"] == "stop" and valid(got["object"], ANSWER)
    elif case == "output_native":
        assert got["finishReason"] == "stop" and valid(got["output"], VERDICT)
    elif case == "output_json":
        # Any JSON object: closed (parsed by the SDK) or cut off by the output cap mid-object.
        if got.get("cutOff"):
            assert got["finishReason"] == "length" and got["text"].startswith("{")
        else:
            assert got["finishReason"] == "stop" and isinstance(got["output"], dict)
    else:
        raise AssertionError(f"run.mjs ran a case this test does not know: {case}")
    if case.startswith("stream_") and "partials" in got:
        assert got["partials"] >= 1


@pytest.mark.usefixtures("ai_sdk")
@pytest.mark.parametrize("provider", ["openai.chat", "openai.responses", "anthropic"])
def test_every_case_of_one_protocol(gateway: Any, provider: str) -> None:
    answers: list[str] = []

    def keep(completion: str, task: Any) -> float:
        answers.append(completion)
        return 1.0

    adapter = VercelAIAdapter(SCRIPTS / "run.mjs", timeout_s=120.0)
    stats, got = gateway.run(adapter, [{"task_id": "p", "provider": provider}], reward_fn=keep)
    assert (stats.finished, stats.failed) == (1, 0), stats.errors
    results = json.loads(answers[0])
    failed = {case: r["error"] for case, r in results.items() if not r["ok"]}
    assert failed == {}
    wrong = {}
    for case, result in results.items():
        try:
            check(case, result)
        except (AssertionError, KeyError, ValueError, jsonschema.ValidationError) as err:
            wrong[case] = f"{type(err).__name__}: {err}; got {json.dumps(result)[:600]}"
    assert wrong == {}
    assert len(results) == 11
    assert got["p"].completions == CALLS and got["p"].reward == 1.0  # all in its session


@pytest.mark.usefixtures("ai_sdk")
def test_episodes_land_in_their_sessions_with_their_rewards(
    gateway: Any, tasks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four episodes at once, two per protocol: each script sees only its own session's URL and
    key (none of the machine's credentials: episode.mjs fails if Vercel's AI_GATEWAY_API_KEY
    reaches it) and its reward line is the episode's reward."""
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "AI_GATEWAY_API_KEY"):
        monkeypatch.setenv(name, "from-the-machine")
    mixed = [{**t, "provider": ("openai", "anthropic")[i % 2]} for i, t in enumerate(tasks)]
    stats, got = gateway.run(VercelAIAdapter(SCRIPTS / "episode.mjs", timeout_s=120.0), mixed)
    assert (stats.finished, stats.failed) == (4, 0), stats.errors
    assert {k: t.reward for k, t in got.items()} == {"t0": 0.0, "t1": 0.25, "t2": 0.5, "t3": 0.75}
    assert all(t.completions == 1 for t in got.values())


@pytest.mark.usefixtures("ai_sdk")
def test_an_answer_is_scored_and_a_crash_fails_with_the_key_redacted(
    gateway: Any, tasks: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[str] = []
    work_root = tmp_path / "episodes"
    work_root.mkdir()

    def exact(completion: str, task: Any) -> float:
        seen.append(completion)
        return 1.0 if completion == task["answer"] else 0.0

    answering = [{**tasks[1], "answer_back": True}, {**tasks[2], "fail": True}]
    adapter = VercelAIAdapter(SCRIPTS / "episode.mjs", timeout_s=120.0, work_root=str(work_root))
    stats, got = gateway.run(adapter, answering, reward_fn=exact)
    assert (stats.finished, stats.failed) == (1, 1) and dict(stats.errors) == {"VercelAIError": 1}
    assert seen == ["2"] and got["t1"].reward == 1.0 and "t2" not in got
    assert "failing on purpose with key <session key>" in caplog.text  # stderr's tail, redacted
    assert list(work_root.iterdir()) == []  # both episodes' directories are gone


def test_the_result_line() -> None:
    assert parse_output('log\n{"reward": 0.5}\n\n', "", 0, secret="k") == (0.5, "")
    assert parse_output('{"answer": "two\\nlines"}', "", 0, secret="k") == (None, "two\nlines")
    assert parse_output('"quoted"\n', "", 0, secret="k") == (None, "quoted")
    assert parse_output("a\nthe answer\n", "", 0, secret="k") == (None, "the answer")
    assert parse_output("", "", 0, secret="k") == (None, "")
    with pytest.raises(VercelAIError, match="reward must be a number"):
        parse_output('{"reward": "high"}', "", 0, secret="k")
    with pytest.raises(VercelAIError, match=r"code 3.*<session key> leaked") as err:
        parse_output("", "sk-abc leaked", 3, secret="sk-abc")
    assert "sk-abc" not in str(err.value)


@pytest.mark.usefixtures("ai_sdk")
def test_the_ai_sdk_connects_only_to_loopback(gateway: Any, tmp_path: Path) -> None:
    """Every connect(2) of Node running the SDK, for both providers, goes to 127.0.0.1."""
    from adapters.test_stays_local import inet_connects, traced

    node, log = traced(NODE24(), tmp_path)
    adapter = VercelAIAdapter(SCRIPTS / "episode.mjs", node=node, timeout_s=120.0)
    tasks = [
        {"task_id": p, "prompt": "hi", "provider": p, "r": 1.0} for p in ("openai", "anthropic")
    ]
    stats, _ = gateway.run(adapter, tasks)
    assert (stats.finished, stats.failed) == (2, 0), stats.errors
    addresses = inet_connects(log)
    assert addresses, "strace saw no connection: Node never reached the gateway"
    assert [a for a in addresses if not is_loopback(a)] == []
