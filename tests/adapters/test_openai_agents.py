"""``openai_agents``: the OpenAI Agents SDK (``openai-agents``), unchanged, against the real gateway
and embedded engine, over both protocols it speaks: Responses (``OpenAIResponsesModel``, its
default) and Chat Completions (``OpenAIChatCompletionsModel``). Every run goes through the adapter
and a real rollout worker, so each episode's calls land in its own session with its reward.

The policy writes random text, so the checks are about the protocol: the SDK parsed each answer
into the items it should, a forced tool was called with arguments its schema accepts and its
result went back to the model, a structured output validates, and the calls took the route of
the protocol asked for. The SDK fails a Responses run whose answer is ``incomplete`` (cut at
``max_output_tokens``), as it does against api.openai.com, and the untrained nano model hardly
ever ends an answer (~1 in 13 within 250 tokens): the engine here serves the nano model made to
end its answers after a few tokens (:func:`terse_model`), so a plain run completes on either
protocol.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import jsonschema
import openai
import pytest
from agents import (
    Agent,
    AgentsException,
    CodeInterpreterTool,
    FunctionTool,
    ItemHelpers,
    MaxTurnsExceeded,
    MessageOutputItem,
    ModelBehaviorError,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    ToolCallItem,
    ToolCallOutputItem,
    WebSearchTool,
    function_tool,
    set_trace_processors,
    set_tracing_disabled,
)
from agents.stream_events import RawResponsesStreamEvent, RunItemStreamEvent
from agents.tracing import Span, Trace, TracingProcessor, flush_traces
from agents.tracing.processors import default_processor
from pydantic import BaseModel, Field
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer

import areal
from areal.adapters.base import AdapterError
from areal.adapters.openai_agents import OpenAIAgentsAdapter
from areal.core.rewards import build_reward
from areal.host.http_server import ServerThread
from areal.plugins.inference.embedded.server import InferenceServer, build_server
from areal.plugins.models.tiny import init_tiny
from support.sockets import outside, watch_sockets

REPO = Path(__file__).resolve().parents[2]
APIS = ["responses", "chat_completions"]
ROUTES = {"responses": "/v1/responses", "chat_completions": "/v1/chat/completions"}
TASKS = [{"task_id": f"t{i}", "question": f"What is {i} plus {i}?", "r": i / 2} for i in range(2)]


@pytest.fixture(scope="module")
def terse_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The nano model, made to end its answers: a constant added to one dimension of every
    token's embedding becomes a feature the final norm passes on at every position, and
    ``<|im_end|>``'s embedding (its output row too: they are tied) gets a little more of it. The
    end token then has a probability of ~0.15 at every step (0.15-0.18 measured over random
    contexts): answers are ~6 tokens long (1 in 7 empty), and run past 200 with a probability
    of ~1e-14. Every other token's logit moves by the same amount, so the text stays random, and
    a grammar (a forced call, a structured output) is followed as before, ending on the end
    token."""
    path = tmp_path_factory.mktemp("terse-model") / "nano"
    init_tiny(path, size="nano", seed=0)
    weights = load_file(path / "model.safetensors")
    embed = weights["model.embed_tokens.weight"]
    embed[:, 0] += 1.0
    embed[json.loads((path / "config.json").read_text())["eos_token_id"], 0] += 0.9
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module")
def engine(terse_model: Path) -> Iterator[tuple[str, InferenceServer]]:
    """The engine behind this module's ``gateway`` (conftest's): the terse model's."""
    server = build_server(str(terse_model), max_total_tokens=16384)
    http = ServerThread(server.app(), "127.0.0.1", 0).start()
    try:
        yield http.url, server
    finally:
        server.engine.stop()
        http.stop()


# --- what the agents use ------------------------------------------------------------------------

CALLS: list[dict[str, Any]] = []  # each invocation of the tools below, with its arguments


@function_tool
def paint(color: Literal["red", "green", "blue"], bright: bool) -> str:
    """Paint the wall in one color."""
    CALLS.append({"tool": "paint", "color": color, "bright": bright})
    return f"painted {color}"


@function_tool
def roll(sides: Literal[4, 6, 8]) -> int:
    """Roll a die."""
    CALLS.append({"tool": "roll", "sides": sides})
    return sides


class Verdict(BaseModel):
    choice: Literal["yes", "no"]
    sure: bool
    score: int = Field(ge=0, le=9)


@pytest.fixture(autouse=True)
def calls() -> Iterator[list[dict[str, Any]]]:
    CALLS.clear()
    yield CALLS
    CALLS.clear()


def routes(gateway: Any) -> list[str]:
    """The paths of the model calls the gateway served, in order."""
    lines = (gateway.log_dir / "gateway.log").read_text().splitlines()
    paths = [line.rsplit("path=", 1)[-1] for line in lines]
    return [p for p in paths if p.startswith("/v1/")]


def run_episodes(gateway: Any, adapter: Any, tasks: list[dict[str, Any]] = TASKS) -> dict[str, Any]:
    """Run one episode per task (rewarded with the task's ``r`` when the agent answered);
    every episode must finish. The trajectories, by task id."""

    def reward(completion: Any, task: dict[str, Any]) -> float:
        assert isinstance(completion, str)
        return float(task["r"])

    stats, got = gateway.run(adapter, tasks, reward_fn=reward)
    assert (stats.finished, stats.failed) == (len(tasks), 0), stats.errors
    assert {k: t.reward for k, t in got.items()} == {t["task_id"]: t["r"] for t in tasks}
    return got  # type: ignore[no-any-return]


def runner(api: str, agent: Agent[Any], results: dict[str, Any], **run: Any) -> Any:
    """An agent function that runs ``agent`` on the task's question with the episode's
    ``run_config`` and keeps the result for the test."""

    async def solve(task: dict[str, Any], run_config: RunConfig) -> Any:
        result = await Runner.run(agent, task["question"], run_config=run_config, **run)
        results[task["task_id"]] = result
        return result

    return OpenAIAgentsAdapter(solve, api=api)


def check_answer(api: str, items: list[Any], final_output: Any) -> None:
    """A text answer: at most one message, whose text is the run's final output. The gateway
    always sends a Responses answer as a message, an empty one too; on Chat Completions the SDK
    leaves an empty answer (~1 in 6 of the terse model's) out of the items."""
    assert all(isinstance(item, MessageOutputItem) for item in items)
    assert isinstance(final_output, str)
    assert final_output == ItemHelpers.text_message_outputs(items)
    assert len(items) == (1 if api == "responses" or final_output else 0)


# --- the protocols ------------------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
def test_plain_run_on_a_model_built_with_the_episode_client(gateway: Any, api: str) -> None:
    """The SDK's own model classes on the ``client`` the adapter hands over."""
    results: dict[str, Any] = {}
    model_class = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel

    async def solve(task: dict[str, Any], client: Any, model: str) -> Any:
        assert isinstance(client, openai.AsyncOpenAI) and client.max_retries == 0
        agent = Agent(
            name="helper",
            instructions="Answer briefly.",
            model=model_class(model=model, openai_client=client),
        )
        results[task["task_id"]] = await Runner.run(agent, task["question"])
        return results[task["task_id"]]

    got = run_episodes(gateway, OpenAIAgentsAdapter(solve))
    for result in results.values():
        check_answer(api, result.new_items, result.final_output)
        assert len(result.raw_responses) == 1
        usage = result.raw_responses[0].usage
        assert usage.requests == 1 and usage.input_tokens > 0
    assert all(t.completions == 1 for t in got.values())
    assert routes(gateway) == [ROUTES[api]] * len(TASKS)


@pytest.mark.parametrize("api", APIS)
def test_streamed_run(gateway: Any, api: str) -> None:
    seen: dict[str, Any] = {}

    async def solve(task: dict[str, Any], run_config: RunConfig) -> Any:
        agent = Agent(name="helper", instructions="Answer briefly.")
        result = Runner.run_streamed(agent, task["question"], run_config=run_config)
        seen[task["task_id"]] = (result, [event async for event in result.stream_events()])
        return result

    got = run_episodes(gateway, OpenAIAgentsAdapter(solve, api=api))
    for result, events in seen.values():
        assert result.is_complete
        check_answer(api, result.new_items, result.final_output)
        raw = [e.data for e in events if isinstance(e, RawResponsesStreamEvent)]
        kinds = [event.type for event in raw]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        deltas = [event.delta for event in raw if event.type == "response.output_text.delta"]
        assert "".join(deltas) == result.final_output
        items = [e for e in events if isinstance(e, RunItemStreamEvent)]
        assert [e.name for e in items] == ["message_output_created"] * len(result.new_items)
        assert [e.item.raw_item for e in items] == [i.raw_item for i in result.new_items]
    assert all(t.completions == 1 for t in got.values())
    assert routes(gateway) == [ROUTES[api]] * len(TASKS)


@pytest.mark.parametrize("api", APIS)
def test_tool_round_trip(
    gateway: Any, api: str, calls: list[dict[str, Any]], terse_model: Path
) -> None:
    """Turn 1 must call a tool; the SDK runs it, resets ``tool_choice`` to auto and sends the
    result back, which the policy reads in its next prompt; turn 2 answers."""
    results: dict[str, Any] = {}
    agent = Agent(
        name="painter",
        instructions="Paint the wall, then say what you did.",
        tools=[paint],
        model_settings=ModelSettings(tool_choice="required"),
    )
    got = run_episodes(gateway, runner(api, agent, results, max_turns=2))
    assert [c["tool"] for c in calls] == ["paint"] * len(TASKS)
    tokenizer = AutoTokenizer.from_pretrained(terse_model)
    for task_id, result in results.items():
        assert [type(item) for item in result.new_items[:2]] == [ToolCallItem, ToolCallOutputItem]
        check_answer(api, result.new_items[2:], result.final_output)
        call, output = result.new_items[0].raw_item, result.new_items[1]
        assert call.name == "paint"
        jsonschema.validate(json.loads(call.arguments), paint.params_json_schema)
        assert output.raw_item["call_id"] == call.call_id
        assert output.output == f"painted {json.loads(call.arguments)['color']}"
        assert got[task_id].completions == 2
        second_prompt = tokenizer.decode(got[task_id].turns[1].prompt_ids)
        assert f"<tool_response>\n{output.output}\n</tool_response>" in second_prompt
    assert routes(gateway) == [ROUTES[api]] * 2 * len(TASKS)


@pytest.mark.parametrize("api", APIS)
def test_a_forced_call_and_the_turn_after_it_are_one_sample(gateway: Any, api: str) -> None:
    """The second prompt of a tool round trip extends the first call token for token (what the
    gateway's chat rendering promises for an agent that resends the call as it came), so the two
    turns train as one sample.

    Fails with the gateway as of this writing: a forced call's output ends at the end of the
    arguments' JSON (``...}}<|im_end|>``), while the chat template renders the call it is sent back
    as ``...}}\n</tool_call><|im_end|>``, so the turns split into two samples."""
    agent = Agent(name="painter", tools=[paint], model_settings=ModelSettings(tool_choice="paint"))
    got = run_episodes(gateway, runner(api, agent, {}, max_turns=2))
    assert [(t.completions, len(t.samples)) for t in got.values()] == [(2, 1)] * len(TASKS)


@pytest.mark.parametrize("choice", ["required", "roll"])
@pytest.mark.parametrize("api", APIS)
def test_forced_tool_call(gateway: Any, api: str, choice: str, calls: list[dict[str, Any]]) -> None:
    """``tool_choice`` "required" (any of the tools) or a tool's name; the run stops at the tool's
    result (``stop_on_first_tool``), which is the final output."""
    results: dict[str, Any] = {}
    agent = Agent(
        name="gamer",
        tools=[paint, roll],
        tool_use_behavior="stop_on_first_tool",
        model_settings=ModelSettings(tool_choice=choice),
    )
    run_episodes(gateway, runner(api, agent, results))
    tools: dict[str, FunctionTool] = {"paint": paint, "roll": roll}
    for result in results.values():
        assert [type(item) for item in result.new_items] == [ToolCallItem, ToolCallOutputItem]
        call = result.new_items[0].raw_item
        assert call.name in (tools if choice == "required" else [choice])
        jsonschema.validate(json.loads(call.arguments), tools[call.name].params_json_schema)
        assert result.final_output == str(result.new_items[1].output)
    assert len(calls) == len(TASKS)
    assert routes(gateway) == [ROUTES[api]] * len(TASKS)


def test_hosted_tools_are_left_out_on_responses(gateway: Any, calls: list[dict[str, Any]]) -> None:
    """An agent that also offers OpenAI's hosted tools (web search, code interpreter) runs: the
    gateway serves function tools only and leaves the hosted ones out of the policy's prompt;
    the forced function call goes through."""
    results: dict[str, Any] = {}
    hosted = [
        WebSearchTool(),
        CodeInterpreterTool({"type": "code_interpreter", "container": {"type": "auto"}}),
    ]
    agent = Agent(
        name="painter",
        tools=[*hosted, paint],
        tool_use_behavior="stop_on_first_tool",
        model_settings=ModelSettings(tool_choice="paint"),
    )
    run_episodes(gateway, runner("responses", agent, results))
    assert [c["tool"] for c in calls] == ["paint"] * len(TASKS)
    assert routes(gateway) == [ROUTES["responses"]] * len(TASKS)


@pytest.mark.parametrize("api", APIS)
def test_structured_output(gateway: Any, api: str) -> None:
    """``output_type=`` a pydantic model: the SDK asks for its JSON schema and validates the
    answer; the adapter hands the reward function the answer as JSON text."""
    results: dict[str, Any] = {}
    answers: dict[str, str] = {}

    async def solve(task: dict[str, Any], run_config: RunConfig) -> Any:
        agent = Agent(name="judge", output_type=Verdict)
        results[task["task_id"]] = await Runner.run(agent, task["question"], run_config=run_config)
        return results[task["task_id"]]

    def reward(completion: str, task: dict[str, Any]) -> float:
        answers[task["task_id"]] = completion
        return 1.0

    stats, _ = gateway.run(OpenAIAgentsAdapter(solve, api=api), TASKS, reward_fn=reward)
    assert stats.finished == len(TASKS), stats.errors
    for task_id, result in results.items():
        assert isinstance(result.final_output, Verdict)
        assert Verdict.model_validate_json(answers[task_id]) == result.final_output
    assert routes(gateway) == [ROUTES[api]] * len(TASKS)


@pytest.mark.parametrize("api", APIS)
def test_a_forced_call_cut_by_max_tokens_is_no_answer(
    gateway: Any, api: str, calls: list[dict[str, Any]]
) -> None:
    """A forced call that ``max_tokens`` cuts off comes back as an unfinished call, never as text
    the SDK would take for the run's answer: on Responses the answer is ``incomplete``, which the
    SDK fails; on Chat Completions the call's arguments are cut, so the SDK tells the model its
    call failed instead of running the tool, and wants another turn. The tool never runs."""
    errors: list[AgentsException] = []

    async def solve(task: dict[str, Any], run_config: RunConfig) -> float:
        settings = ModelSettings(tool_choice="paint", max_tokens=4)
        agent = Agent(name="painter", tools=[paint], model_settings=settings)
        try:
            await Runner.run(agent, task["question"], run_config=run_config, max_turns=1)
        except AgentsException as err:
            errors.append(err)
        return 0.0

    stats, got = gateway.run(OpenAIAgentsAdapter(solve, api=api), TASKS[:1])
    assert stats.finished == 1, stats.errors
    assert got["t0"].turns[0].finish_reason == "length"
    if api == "responses":
        assert [type(e) for e in errors] == [ModelBehaviorError]
        assert "max_output_tokens" in str(errors[0])
    else:
        assert [type(e) for e in errors] == [MaxTurnsExceeded]
        items = errors[0].run_data.new_items if errors[0].run_data else []
        assert [type(item) for item in items] == [ToolCallItem, ToolCallOutputItem]
        assert items[0].raw_item.name == "paint"
    assert calls == []


# --- the adapter --------------------------------------------------------------------------------

MODULE_AGENT = Agent(name="helper", instructions="Answer briefly.")  # built outside any episode


@pytest.mark.parametrize("api", APIS)
def test_an_sdk_agent_is_run_on_the_task(gateway: Any, api: str) -> None:
    """An ``agents.Agent`` as the agent: run on the task's question; its final output is the
    answer the reward function scores, a structured one as JSON text."""
    run_episodes(gateway, OpenAIAgentsAdapter(MODULE_AGENT, api=api))  # the answers are text
    answers: dict[str, str] = {}

    def reward(completion: str, task: dict[str, Any]) -> float:
        answers[task["task_id"]] = completion
        return 1.0

    judge = Agent(name="judge", output_type=Verdict)
    stats, _ = gateway.run(OpenAIAgentsAdapter(judge, api=api), TASKS, reward_fn=reward)
    assert stats.finished == len(TASKS), stats.errors
    assert all(Verdict.model_validate_json(answer) for answer in answers.values())
    assert routes(gateway) == [ROUTES[api]] * 2 * len(TASKS)


def test_unchanged_code_without_client_reaches_its_own_episode(gateway: Any) -> None:
    """Code that names no client, model or run config (``Runner.run(agent, question)`` on an
    agent built at import): the SDK builds its client from its episode's ``OPENAI_*`` and takes
    the policy as its default model. Four episodes at once: each session records its own call."""
    tasks = [{**t, "task_id": f"u{i}", "r": i / 4} for i, t in enumerate(TASKS * 2)]

    async def solve(task: dict[str, Any]) -> str:
        result = await Runner.run(MODULE_AGENT, task["question"])
        return str(result.final_output)

    got = run_episodes(gateway, OpenAIAgentsAdapter(solve), tasks)
    assert [t.completions for t in got.values()] == [1, 1, 1, 1]
    assert routes(gateway) == ["/v1/responses"] * 4  # the SDK's default protocol


def sync_with_run_config(task: dict[str, Any], run_config: RunConfig) -> Any:
    return Runner.run_sync(MODULE_AGENT, task["question"], run_config=run_config)


def sync_unchanged(task: dict[str, Any]) -> Any:
    return Runner.run_sync(MODULE_AGENT, task["question"])


@pytest.mark.parametrize(
    ("api", "solve"),
    [
        ("responses", sync_with_run_config),
        ("chat_completions", sync_with_run_config),
        (None, sync_unchanged),
    ],
)
def test_sync_agent_with_run_sync(gateway: Any, api: str | None, solve: Any) -> None:
    """A sync agent (``Runner.run_sync``) runs in a worker thread on an event loop of its own.
    Without ``run_config`` the SDK builds its client itself: on the episode's HTTP pool, not the
    SDK's process-wide one (bound to another episode's loop, it fails every later episode)."""
    tasks = [{**t, "task_id": f"s{i}", "r": i / 4} for i, t in enumerate(TASKS * 2)]
    got = run_episodes(gateway, OpenAIAgentsAdapter(solve, api=api), tasks)
    assert [t.completions for t in got.values()] == [1] * len(tasks)
    assert routes(gateway) == [ROUTES[api or "responses"]] * len(tasks)


def test_the_example_agent_runs_and_is_scored(
    gateway: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``examples/openai_agents_math``: its ``Agent``, with the reward its config names, on the
    first of its tasks. The policy answers no sum right: a real 0.0, scored, not missing."""
    monkeypatch.syspath_prepend(str(REPO))
    from examples.openai_agents_math.agent import agent

    task = json.loads((REPO / "examples/openai_agents_math/tasks.jsonl").read_text().split("\n")[0])
    stats, got = gateway.run(
        OpenAIAgentsAdapter(agent), [task], reward_fn=build_reward("math_answer")
    )
    assert (stats.finished, stats.failed) == (1, 0), stats.errors
    assert got[task["task_id"]].reward == 0.0 and got[task["task_id"]].completions >= 1


def test_wrap_by_framework_name_and_an_sdk_agent() -> None:
    """``openai_agents`` is registered, and the built-in guess sends an ``agents.Agent`` to it."""

    async def solve(task: dict[str, Any], run_config: RunConfig) -> None:
        return None

    assert isinstance(areal.wrap(solve, framework="openai_agents"), OpenAIAgentsAdapter)
    assert isinstance(areal.wrap(MODULE_AGENT), OpenAIAgentsAdapter)
    with pytest.raises(AdapterError, match="api must be"):
        OpenAIAgentsAdapter(solve, api="completions")  # type: ignore[arg-type]


# --- tracing: off unless asked for, and nothing leaves 127.0.0.1 ---------------------------------


class Recorder(TracingProcessor):
    """A trace processor that keeps what it is given (as an OpenTelemetry exporter would)."""

    def __init__(self) -> None:
        self.traces: list[Trace] = []
        self.spans: list[Span[Any]] = []

    def on_trace_start(self, trace: Trace) -> None:
        self.traces.append(trace)

    def on_trace_end(self, trace: Trace) -> None:
        pass

    def on_span_start(self, span: Span[Any]) -> None:
        pass

    def on_span_end(self, span: Span[Any]) -> None:
        self.spans.append(span)

    def shutdown(self) -> None:
        pass

    def force_flush(self) -> None:
        pass


@pytest.fixture
def fresh_tracing() -> Iterator[None]:
    """Tracing as a fresh process has it: on, exporting to OpenAI. Left off afterwards, with the
    SDK's own processor back."""
    set_tracing_disabled(False)
    try:
        yield
    finally:
        set_trace_processors([default_processor()])
        set_tracing_disabled(True)


@pytest.mark.usefixtures("fresh_tracing")
def test_tracing_is_off_and_nothing_leaves_loopback(
    gateway: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an OpenAI key in the environment the SDK's exporter would send the trace of every run
    to api.openai.com, of code that names no run config too; under the adapter it gets none,
    and no connection (nor a name lookup) goes anywhere but 127.0.0.1, the forced export at the
    end included."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-would-be-sent-to-openai")
    recorder = Recorder()
    set_trace_processors([default_processor(), recorder])

    async def solve(task: dict[str, Any]) -> str:
        return str((await Runner.run(MODULE_AGENT, task["question"])).final_output)

    with watch_sockets() as sockets:
        run_episodes(gateway, OpenAIAgentsAdapter(solve))
        flush_traces()
    assert recorder.traces == [] and recorder.spans == []
    assert any(kind == "connect" for kind, _ in sockets)  # the watch works: calls were seen
    assert outside(sockets) == []


@pytest.mark.usefixtures("fresh_tracing")
def test_tracing_on_when_asked_for(gateway: Any) -> None:
    """``tracing=True`` leaves the SDK's tracing alone: the processors the user installed (here
    one that records, in place of the exporter to OpenAI) get each run's trace and spans."""
    recorder = Recorder()
    set_trace_processors([recorder])
    run_episodes(gateway, OpenAIAgentsAdapter(MODULE_AGENT, tracing=True))
    assert len(recorder.traces) == len(TASKS)
    kinds = {span.span_data.type for span in recorder.spans}
    assert {"agent", "response"} <= kinds
