"""``dspy``: DSPy programs, unchanged, on the gateway's Chat Completions route through a real
rollout worker, gateway and nano engine, on DSPy's native engine and on LiteLLM: plain and
streamed predictions, forced native tool calls, a ``ReActV2`` tool round trip and
``JSONAdapter`` structured output. Each episode's calls land in its own session, with its reward.

The untrained policy writes random text, so the tests check what the protocol guarantees, not
what the policy says: replies parse, tool arguments satisfy their schema, outputs have their
types. Structured replies use schemas the engine's grammar constrains completely (booleans,
enums, bounded digits); DSPy's ChatAdapter cannot parse random text and falls back to its
JSONAdapter once, which the LM's declared capabilities turn into a json_schema request.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import dspy
import pytest
from dspy.clients import model_metadata
from dspy.streaming import StreamListener, StreamResponse
from pydantic import BaseModel, Field

from areal.adapters.dspy import DSPyAdapter
from support.sockets import outside, watch_sockets

Digit = Literal[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]  # an enum in the tool's schema
REWARDS = {"t0": 0.0, "t1": 0.25, "t2": 0.5, "t3": 0.75}
SQUARE = {"type": "function", "function": {"name": "square"}}
STAY_LOCAL = ("LITELLM_LOCAL_MODEL_COST_MAP", "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS")


class Verdict(dspy.Signature):
    """Judge the question."""

    question: str = dspy.InputField()
    ok: bool = dspy.OutputField()
    mood: Literal["calm", "busy"] = dspy.OutputField()


class Pick(BaseModel):
    d: Annotated[int, Field(ge=0, le=9)]


class Picked(dspy.Signature):
    question: str = dspy.InputField()
    pick: Pick = dspy.OutputField()
    sure: bool = dspy.OutputField()


class Calls(dspy.Signature):
    question: str = dspy.InputField()
    tools: list[dspy.Tool] = dspy.InputField()
    calls: dspy.ToolCalls = dspy.OutputField()


def digit_tools(calls: list[tuple[str, Any]]) -> list[dspy.Tool]:
    def square(d: Digit) -> int:
        """Square a digit."""
        calls.append(("square", d))
        return d * d

    def flip(up: bool) -> bool:
        """Flip a switch."""
        calls.append(("flip", up))
        return not up

    return [dspy.Tool(square), dspy.Tool(flip)]


def run(gateway: Any, agent: Any, tasks: list[dict[str, Any]], **options: Any) -> Any:
    reward_fn = options.pop("reward_fn", None)
    adapter = DSPyAdapter(agent, max_tokens=64, **options)
    stats, got = gateway.run(adapter, tasks, reward_fn=reward_fn)
    assert (stats.finished, stats.failed) == (len(tasks), 0), stats.errors
    return got


def test_plain_predictions_in_each_episode_session(
    gateway: Any, tasks: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A direct LM call twice (both reach the policy: no cache) and a ``Predict`` in the episode's
    ``dspy.context``, four episodes at once."""
    monkeypatch.setenv("DSPY_CACHEDIR", str(tmp_path / "dspy-cache"))

    async def agent(task: dict[str, Any], lm: Any, config: dict[str, Any]) -> float:
        assert isinstance(lm, dspy.LM) and dspy.settings.lm is lm
        assert lm.model == f"openai/{config['model_name']}"
        assert lm.cache is False and lm.num_retries == 0
        for _ in range(2):
            [text] = await lm.acall(task["question"])
            assert isinstance(text, str)
        prediction = await dspy.Predict("question -> ok: bool").acall(question=task["question"])
        assert isinstance(prediction.ok, bool)
        return float(task["r"])

    got = run(gateway, agent, tasks)
    assert {k: t.reward for k, t in got.items()} == REWARDS
    # 2 direct calls; ChatAdapter's text, then its JSON fallback
    assert all(t.completions == 4 for t in got.values())
    assert not (tmp_path / "dspy-cache").exists()


def test_streamed_prediction(gateway: Any, tasks: Any) -> None:
    async def agent(task: dict[str, Any], lm: Any) -> float:
        listener = StreamListener(signature_field_name="ok")
        predict = dspy.Predict("question -> ok: bool")
        program = dspy.streamify(predict, stream_listeners=[listener], is_async_program=True)
        with dspy.context(adapter=dspy.JSONAdapter()):
            seen = [chunk async for chunk in program(question=task["question"])]
        *chunks, prediction = seen
        assert isinstance(prediction, dspy.Prediction) and isinstance(prediction.ok, bool)
        assert chunks and all(isinstance(c, StreamResponse) for c in chunks)
        assert "".join(c.chunk for c in chunks).strip() == str(prediction.ok).lower()
        return float(task["r"])

    got = run(gateway, agent, tasks[1:2])
    assert got["t1"].reward == 0.25 and got["t1"].completions == 1


def test_forced_native_tool_calls(gateway: Any, tasks: Any) -> None:
    """``tool_choice`` required (either tool) and named (``square``), through native function
    calling; each call executes with arguments its schema allows."""
    calls: list[tuple[str, Any]] = []

    async def agent(task: dict[str, Any], lm: Any) -> float:
        tools = digit_tools(calls)
        with dspy.context(adapter=dspy.ChatAdapter(use_native_function_calling=True)):
            for choice in ("required", SQUARE):
                predict = dspy.Predict(Calls, tool_choice=choice)
                prediction = await predict.acall(question=task["question"], tools=tools)
                [call] = prediction.calls.tool_calls
                call.execute(functions=tools)
        return float(task["r"])

    got = run(gateway, agent, tasks[2:3])
    assert got["t2"].reward == 0.5 and got["t2"].completions == 2
    (first, arg), (second, d) = calls
    assert (first, type(arg)) in (("square", int), ("flip", bool))
    assert second == "square" and d in range(10)


def test_a_forced_call_cut_by_the_token_limit(gateway: Any, tasks: Any) -> None:
    """Cut by ``max_tokens``, a forced call still reaches DSPy as a call of its tool, not as text
    for the adapter to parse; of its arguments nothing was written."""

    async def agent(task: dict[str, Any], lm: Any) -> float:
        tools = digit_tools([])
        with dspy.context(adapter=dspy.ChatAdapter(use_native_function_calling=True)):
            predict = dspy.Predict(Calls, tool_choice=SQUARE, max_tokens=6)
            prediction = await predict.acall(question=task["question"], tools=tools)
        [call] = prediction.calls.tool_calls
        assert call.name == "square" and not call.args
        return float(task["r"])

    got = run(gateway, agent, tasks[:1])
    assert got["t0"].reward == 0.0 and got["t0"].completions == 1


def test_react_tool_round_trip(gateway: Any, tasks: Any) -> None:
    """``ReActV2`` on native function calling: a call of ``square`` (forced by the LM's default
    ``tool_choice``), its result sent back, then the forced ``submit`` with typed outputs."""
    calls: list[tuple[str, Any]] = []

    async def agent(task: dict[str, Any], lm: Any) -> float:
        forced = lm.copy(tool_choice=SQUARE)
        react = dspy.ReActV2(Verdict, tools=digit_tools(calls)[:1], max_iters=1)
        with dspy.context(lm=forced, adapter=dspy.JSONAdapter()):
            prediction = await react.acall(question=task["question"])
        assert prediction.termination_reason == "forced_submit"
        assert isinstance(prediction.ok, bool) and prediction.mood in ("calm", "busy")
        [(name, d)] = calls
        assert name == "square" and d in range(10)
        sent = forced.history[-1]["messages"]  # what the submit request carried
        [result] = [message for message in sent if message["role"] == "tool"]
        assert result["name"] == "square" and result["content"] == str(d * d)
        return float(task["r"])

    got = run(gateway, agent, tasks[3:])
    assert got["t3"].reward == 0.75 and got["t3"].completions == 2


def test_structured_output_with_the_json_adapter(gateway: Any, tasks: Any) -> None:
    """Typed outputs (a bool, an enum, a pydantic model) in one JSON reply each: random text
    could not parse, so they parse because the request carried their json_schema."""

    async def agent(task: dict[str, Any], lm: Any) -> float:
        with dspy.context(adapter=dspy.JSONAdapter()):
            verdict = await dspy.Predict(Verdict).acall(question=task["question"])
            picked = await dspy.Predict(Picked).acall(question=task["question"])
        assert isinstance(verdict.ok, bool) and verdict.mood in ("calm", "busy")
        assert isinstance(picked.pick, Pick) and isinstance(picked.sure, bool)
        return float(task["r"])

    got = run(gateway, agent, tasks[:1])
    assert got["t0"].reward == 0.0 and got["t0"].completions == 2


def test_sync_agent_and_its_prediction_as_the_answer(gateway: Any, tasks: Any) -> None:
    """A sync program, in a worker thread, sees its own episode's LM; the ``answer`` of the
    prediction it returns is what the reward function scores."""

    def agent(task: dict[str, Any], lm: Any) -> Any:
        assert dspy.settings.lm is lm
        with dspy.context(adapter=dspy.JSONAdapter()):
            return dspy.Predict("question -> answer: bool")(question=task["question"])

    def judged(completion: Any, task: Any) -> float:
        return 1.0 if completion in ("True", "False") else 0.0

    got = run(gateway, agent, tasks[:2], reward_fn=judged)
    assert {k: t.reward for k, t in got.items()} == {"t0": 1.0, "t1": 1.0}
    assert all(t.completions == 1 for t in got.values())


@pytest.mark.parametrize("route", ["auto", "litellm"])
def test_nothing_leaves_loopback(
    gateway: Any, tasks: Any, monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    """DSPy's native engine and LiteLLM both fetch LiteLLM's model-price map from GitHub unless
    told to use the bundled one: wrapping an agent tells them, and an episode's calls (a text
    call, a forced tool call, structured output: DSPy prices each) connect only to 127.0.0.1."""
    for name in (*STAY_LOCAL, "LITELLM_OFFLINE_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(model_metadata, "_data", None)  # loaded again, in the watched episode
    calls: list[tuple[str, Any]] = []

    async def agent(task: dict[str, Any], lm: Any) -> float:
        await lm.acall(task["question"])
        with dspy.context(adapter=dspy.JSONAdapter()):
            tools = digit_tools(calls)
            predict = dspy.Predict(Calls, tool_choice="required")
            prediction = await predict.acall(question=task["question"], tools=tools)
            [call] = prediction.calls.tool_calls
            call.execute(functions=tools)
            verdict = await dspy.Predict(Verdict).acall(question=task["question"])
        assert isinstance(verdict.ok, bool)
        return float(task["r"])

    adapter = DSPyAdapter(agent, engine=route, max_tokens=64)
    assert all(os.environ[name] == "True" for name in STAY_LOCAL)
    with watch_sockets() as sockets:
        stats, got = gateway.run(adapter, tasks[1:2])
    assert (stats.finished, stats.failed) == (1, 0), stats.errors
    assert got["t1"].completions == 3 and len(calls) == 1
    assert any(kind == "connect" for kind, _ in sockets)  # the watch works: calls were seen
    assert outside(sockets) == []


def test_results_become_text() -> None:
    adapter = DSPyAdapter(lambda task, lm: None)
    assert adapter.result(dspy.Prediction(answer=42, reasoning="...")) == "42"
    assert json.loads(adapter.result(dspy.Prediction(ok=True, mood="calm"))) == {
        "ok": True,
        "mood": "calm",
    }
    assert adapter.result(0.5) == 0.5 and adapter.result(None) is None
