"""``pydantic_ai``: Pydantic AI agents, unchanged, on the gateway's Chat Completions and Anthropic
Messages routes, through a real rollout worker, gateway and nano engine: plain and streamed runs,
a tool round trip, forced calls, structured output (output tools and native), sync agents and
``Agent`` objects. Each episode's calls land in its own session, with its reward.

The untrained policy writes random text, so the tests check what the protocol guarantees, not
what the policy says: the reply parsed, tool arguments satisfy their schema, outputs validate.
Every structured reply uses a schema the engine's grammar constrains completely (booleans,
enums, bounded digits), so it validates whatever the policy samples; no retries are needed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import opentelemetry.trace
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel, Field
from pydantic_ai import (
    Agent,
    AgentRunResultEvent,
    ModelRequest,
    ModelResponse,
    NativeOutput,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ToolCallPart,
    ToolOutput,
    ToolReturnPart,
    UnexpectedModelBehavior,
    capture_run_messages,
)
from pydantic_ai.capabilities import AbstractCapability, Instrumentation
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from areal.adapters.base import AdapterError
from areal.adapters.pydantic_ai import PydanticAIAdapter
from support.sockets import outside, watch_sockets

PROTOCOLS = ["openai", "anthropic"]
MODEL_CLASS = {"openai": OpenAIChatModel, "anthropic": AnthropicModel}
REWARDS = {"t0": 0.0, "t1": 0.25, "t2": 0.5, "t3": 0.75}
FORCED = {"max_tokens": 128}  # a forced call of these schemas closes in about 40 tokens

Digit = Annotated[int, Field(ge=0, le=9)]


class Verdict(BaseModel):
    """A structured output the engine's grammar fully constrains, on both protocols."""

    ok: bool
    mood: Literal["calm", "busy"]


class Pick(BaseModel):
    d: Digit


@dataclass
class ForceCalls(AbstractCapability[Any]):
    """The first request must call one of ``first``, every later one the output tool: a run of
    exactly two requests, whatever the policy writes."""

    first: list[str]

    def get_model_settings(self) -> Any:
        return lambda ctx: {"tool_choice": self.first if ctx.run_step == 1 else ["final_result"]}


def digit_tools(calls: list[tuple[str, int]]) -> list[Any]:
    def square(d: Digit) -> int:
        """Square a digit."""
        calls.append(("square", d))
        return d * d

    def cube(d: Digit) -> int:
        """Cube a digit."""
        calls.append(("cube", d))
        return d * d * d

    return [square, cube]


def run(gateway: Any, agent: Any, tasks: list[dict[str, Any]], protocol: str, **kw: Any) -> Any:
    stats, got = gateway.run(PydanticAIAdapter(agent, protocol=protocol), tasks, **kw)
    assert (stats.finished, stats.failed) == (len(tasks), 0), stats.errors
    return got


def tool_returns(messages: list[Any]) -> list[ToolReturnPart]:
    return [
        part
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_plain_run_in_each_episode_session(gateway: Any, tasks: Any, protocol: str) -> None:
    async def agent(task: dict[str, Any], llm: Any, config: dict[str, Any]) -> float:
        assert isinstance(llm, MODEL_CLASS[protocol]) and llm.client.max_retries == 0
        assert llm.model_name == config["model_name"]
        result = await Agent(llm, model_settings={"max_tokens": 8}).run(task["question"])
        assert isinstance(result.output, str) and result.usage.requests == 1
        return float(task["r"])

    got = run(gateway, agent, tasks, protocol)
    assert {k: t.reward for k, t in got.items()} == REWARDS
    assert all(t.completions == 1 for t in got.values())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_streamed_runs(gateway: Any, tasks: Any, protocol: str) -> None:
    """Text streamed as deltas (``run_stream``), as events (``run_stream_events``), and a
    structured output streamed as a forced call's arguments."""

    async def agent(task: dict[str, Any], llm: Any) -> float:
        chat = Agent(llm, model_settings={"max_tokens": 8})
        async with chat.run_stream(task["question"]) as stream:
            deltas = [delta async for delta in stream.stream_text(delta=True)]
            output = await stream.get_output()
        assert isinstance(output, str) and "".join(deltas) == output

        async with chat.run_stream_events(task["question"]) as events:
            seen = [event async for event in events]
        text = ""
        for event in seen:
            if isinstance(event, PartStartEvent):
                assert isinstance(event.part, TextPart)
                text += event.part.content
            elif isinstance(event, PartDeltaEvent):
                assert isinstance(event.delta, TextPartDelta)
                text += event.delta.content_delta
        assert isinstance(seen[-1], AgentRunResultEvent) and seen[-1].result.output == text

        structured = Agent(llm, output_type=Verdict, model_settings=FORCED, retries=0)
        async with structured.run_stream(task["question"]) as stream:
            partial = [out async for out in stream.stream_output()]
            verdict = await stream.get_output()
        assert isinstance(verdict, Verdict) and partial[-1] == verdict
        return float(task["r"])

    got = run(gateway, agent, tasks[1:2], protocol)
    assert got["t1"].reward == 0.25 and got["t1"].completions == 3


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_tool_round_trip(gateway: Any, tasks: Any, protocol: str) -> None:
    """A forced call of the ``square`` tool, its result sent back, then the output tool."""
    calls: list[tuple[str, int]] = []

    async def agent(task: dict[str, Any], llm: Any) -> float:
        solver = Agent(
            llm, output_type=Verdict, tools=digit_tools(calls), retries=0,
            capabilities=[ForceCalls(["square"])], model_settings=FORCED,
        )  # fmt: skip
        result = await solver.run(task["question"])
        assert isinstance(result.output, Verdict)
        assert result.usage.requests == 2 and result.usage.tool_calls == 1
        [(name, d)] = calls
        assert name == "square" and 0 <= d <= 9
        square = [r for r in tool_returns(result.all_messages()) if r.tool_name == "square"]
        assert [r.content for r in square] == [d * d]  # what went back in the second request
        return float(task["r"])

    got = run(gateway, agent, tasks[2:3], protocol)
    assert got["t2"].reward == 0.5 and got["t2"].completions == 2


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_call_forced_among_some_of_the_tools(gateway: Any, tasks: Any, protocol: str) -> None:
    """``tool_choice=["square", "cube"]`` of three tools: Chat Completions sends it as an
    ``allowed_tools`` choice (mode required), Anthropic as ``any`` over those two."""
    calls: list[tuple[str, int]] = []

    async def agent(task: dict[str, Any], llm: Any) -> float:
        solver = Agent(
            llm, output_type=Verdict, tools=digit_tools(calls), retries=0,
            capabilities=[ForceCalls(["square", "cube"])], model_settings=FORCED,
        )  # fmt: skip
        result = await solver.run(task["question"])
        assert isinstance(result.output, Verdict) and result.usage.requests == 2
        [(name, d)] = calls
        assert name in ("square", "cube") and 0 <= d <= 9
        return float(task["r"])

    got = run(gateway, agent, tasks[3:], protocol)
    assert got["t3"].reward == 0.75 and got["t3"].completions == 2


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_structured_output(gateway: Any, tasks: Any, protocol: str) -> None:
    """Native structured output (``response_format`` json_schema, ``output_config.format``) and
    a call forced among two output tools (``required``, ``any``)."""

    async def agent(task: dict[str, Any], llm: Any) -> float:
        native = Agent(llm, output_type=NativeOutput(Verdict), model_settings=FORCED, retries=0)
        result = await native.run(task["question"])
        assert isinstance(result.output, Verdict) and result.usage.requests == 1
        [reply] = [m for m in result.all_messages() if isinstance(m, ModelResponse)]
        assert [type(p) for p in reply.parts] == [TextPart]  # JSON text, not a tool call

        outputs = [ToolOutput(Verdict, name="verdict"), ToolOutput(Pick, name="pick")]
        either = Agent(llm, output_type=outputs, model_settings=FORCED, retries=0)
        result = await either.run(task["question"])
        assert isinstance(result.output, Verdict | Pick) and result.usage.requests == 1
        [reply] = [m for m in result.all_messages() if isinstance(m, ModelResponse)]
        [call] = reply.parts
        assert isinstance(call, ToolCallPart) and call.tool_name in ("verdict", "pick")
        return float(task["r"])

    got = run(gateway, agent, tasks[:1], protocol)
    assert got["t0"].reward == 0.0 and got["t0"].completions == 2


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_forced_call_cut_by_the_token_limit(gateway: Any, tasks: Any, protocol: str) -> None:
    """Cut by ``max_tokens``, a forced call still comes back as a call, with the protocol's
    truncation finish: Pydantic AI reports an output that failed validation, not text where no
    text was allowed."""

    async def agent(task: dict[str, Any], llm: Any) -> float:
        cut = Agent(llm, output_type=Verdict, model_settings={"max_tokens": 6}, retries=0)
        with capture_run_messages() as messages, pytest.raises(UnexpectedModelBehavior):
            await cut.run(task["question"])
        [reply] = [m for m in messages if isinstance(m, ModelResponse)]
        assert reply.finish_reason == "length"
        [call] = reply.parts
        assert isinstance(call, ToolCallPart) and call.tool_name == "final_result"
        return float(task["r"])

    got = run(gateway, agent, tasks[1:2], protocol)
    assert got["t1"].reward == 0.25 and got["t1"].completions == 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_sync_agent_runs_in_a_thread(gateway: Any, tasks: Any, protocol: str) -> None:
    """``run_sync`` on the thread's event loop, or ``asyncio.run`` on a loop of its own."""

    def agent(task: dict[str, Any], llm: Any) -> str:
        assert isinstance(llm, MODEL_CLASS[protocol])
        chat = Agent(llm, model_settings={"max_tokens": 4})
        if task["task_id"] == "t0":
            return chat.run_sync(task["question"]).output
        return asyncio.run(chat.run(task["question"])).output

    def answered(completion: Any, task: Any) -> float:
        return 1.0 if isinstance(completion, str) else 0.0

    got = run(gateway, agent, tasks[:2], protocol, reward_fn=answered)
    assert {k: t.reward for k, t in got.items()} == {"t0": 1.0, "t1": 1.0}
    assert all(t.completions == 1 for t in got.values())


def test_an_agent_object_runs_on_the_episode_model(gateway: Any, tasks: Any) -> None:
    """Built on a model that does not exist; each episode runs it on its own, and its
    structured output is the answer, as JSON text, that the reward function scores."""
    elsewhere = OpenAIChatModel(
        "gpt-x", provider=OpenAIProvider(base_url="http://127.0.0.1:9/v1", api_key="unused")
    )
    agent = Agent(elsewhere, output_type=Verdict, model_settings=FORCED, retries=0)
    assert PydanticAIAdapter.accepts(agent) and not PydanticAIAdapter.accepts(lambda t, llm: 0)

    def valid(completion: str, task: Any) -> float:
        return 1.0 if Verdict.model_validate_json(completion) else 0.0

    got = run(gateway, agent, tasks[:2], "anthropic", reward_fn=valid)
    assert {k: t.reward for k, t in got.items()} == {"t0": 1.0, "t1": 1.0}
    assert all(t.completions == 1 for t in got.values())


def test_models_built_from_a_name_reach_their_own_episode(gateway: Any, tasks: Any) -> None:
    """Four concurrent episodes ignore the model handed in and name one (``openai-chat:`` or
    ``anthropic:``): the providers read OPENAI_* / ANTHROPIC_* of their own episode."""

    async def agent(task: dict[str, Any], llm: Any, model: str) -> float:
        prefix = "openai-chat" if task["r"] < 0.5 else "anthropic"
        named = Agent(f"{prefix}:{model}", model_settings={"max_tokens": 4})
        await named.run(task["question"])
        return float(task["r"])

    got = run(gateway, agent, tasks, "openai")
    assert {k: t.reward for k, t in got.items()} == REWARDS
    assert all(t.completions == 1 for t in got.values())


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """An OpenTelemetry setup as a user's application would have one (a global tracer provider),
    exporting to memory; the process's own provider comes back after the test."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(opentelemetry.trace, "_TRACER_PROVIDER", provider)
    return exporter


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_no_telemetry_unless_turned_on_and_nothing_leaves_loopback(
    gateway: Any, tasks: Any, spans: InMemorySpanExporter, protocol: str
) -> None:
    """Under an application's OpenTelemetry setup, an episode adds no span (the Anthropic SDK
    would trace each call by itself) and connects to nothing but 127.0.0.1; an agent that turns
    Pydantic AI's instrumentation on gets its spans, in that setup."""

    async def quiet(task: dict[str, Any], llm: Any) -> float:
        await Agent(llm, model_settings={"max_tokens": 4}).run(task["question"])
        return 1.0

    async def traced(task: dict[str, Any], llm: Any) -> float:
        on = Agent(llm, capabilities=[Instrumentation()], model_settings={"max_tokens": 4})
        await on.run(task["question"])
        return 1.0

    with watch_sockets() as sockets:
        run(gateway, quiet, tasks[:1], protocol)
    assert spans.get_finished_spans() == ()  # neither Pydantic AI's nor the Anthropic SDK's
    assert any(kind == "connect" for kind, _ in sockets)  # the watch works: calls were seen
    assert outside(sockets) == []

    run(gateway, traced, tasks[1:2], protocol)  # turned on by the user: spans, to their exporter
    names = [span.name for span in spans.get_finished_spans()]
    assert any(name.startswith("chat ") for name in names), names


def test_a_wrong_protocol_is_refused_at_wrap_time() -> None:
    with pytest.raises(AdapterError, match="protocol must be 'openai' or 'anthropic'"):
        PydanticAIAdapter(lambda task, llm: 0.0, protocol="gemini")  # type: ignore[arg-type]
