"""``litellm``: LiteLLM used as a client (``litellm.completion`` / ``acompletion``), unmodified,
against the real gateway and nano engine through its OpenAI route (``model="openai/..."``) and its
Anthropic route (``model="anthropic/..."``), each call in an episode of a real rollout worker.

For each protocol: a plain and a streamed reply, forced tool calls (``tool_choice`` required and
named, one streamed), a tool round trip (the tool's result goes back in a second call) and
structured output (``response_format`` json_schema, a pydantic model, and JSON mode where LiteLLM
sends it). The untrained policy writes noise, so what is checked is the protocol: LiteLLM parsed
each reply into its types, tool arguments and objects satisfy their schemas (checked with
``jsonschema`` and pydantic), every call landed in the episode's session. And LiteLLM stays on the
machine: no download at import once wrapped, no connection beyond 127.0.0.1 while it runs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, Literal

import jsonschema
import pytest
from pydantic import BaseModel, Field

from areal.adapters.litellm import STAY_LOCAL, LiteLLMAdapter, LiteLLMClient, stay_local
from support.sockets import outside, watch_sockets
from support.tool_schemas import ARGS, FLIP

stay_local()  # before LiteLLM's import, which would otherwise download its model-price map
import litellm  # noqa: E402

# LiteLLM's own types warn about pydantic's handling of ReadOnly TypedDict items when first built.
pytestmark = pytest.mark.filterwarnings("ignore:Items? .* `ReadOnly` qualifier:UserWarning")

PROTOCOLS = ["openai", "anthropic"]
MESSAGES = [{"role": "user", "content": "What is 2 plus 3?"}]
CALC_TOOL = {
    "type": "function",
    "function": {"name": "calc", "description": "Calculate.", "parameters": ARGS},
}
FLIP_TOOL = {
    "type": "function",
    "function": {"name": "flip", "description": "Flip a coin.", "parameters": FLIP},
}


class Answer(BaseModel):
    n: int = Field(ge=0, le=9)
    ok: bool
    color: Literal["red", "blue"]


def run_episode(gateway: Any, agent: Callable[..., Any], protocol: str) -> Any:
    """One episode of ``agent`` through the adapter; its trajectory."""
    adapter = LiteLLMAdapter(agent, protocol=protocol)
    stats, got = gateway.run(adapter, [{"task_id": "e", "question": "What is 2 plus 3?"}])
    assert (stats.finished, stats.failed) == (1, 0), stats.errors
    return got["e"]


def tool_call(message: Any, name: str, schema: dict[str, Any]) -> Any:
    """The message's one tool call, named ``name``, its arguments valid for ``schema``."""
    assert message.tool_calls is not None and len(message.tool_calls) == 1
    call = message.tool_calls[0]
    assert call.type == "function" and call.function.name == name and call.id
    jsonschema.validate(json.loads(call.function.arguments), schema)
    return call


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_plain_from_a_sync_agent(gateway: Any, protocol: str) -> None:
    replies: list[Any] = []

    def sync_agent(task: dict[str, Any], client: LiteLLMClient) -> float:
        replies.append(client.completion(messages=MESSAGES, max_tokens=5))
        replies.append(litellm.completion(**client.params, messages=MESSAGES, max_tokens=5))
        return 1.0

    trajectory = run_episode(gateway, sync_agent, protocol)
    assert trajectory.completions == 2 and trajectory.reward == 1.0
    for reply in replies:
        assert isinstance(reply, litellm.ModelResponse)
        choice = reply.choices[0]
        assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
        assert choice.finish_reason in ("length", "stop") and reply.usage.completion_tokens <= 5


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_streamed(gateway: Any, protocol: str) -> None:
    chunks: list[Any] = []

    async def agent(task: dict[str, Any], client: LiteLLMClient) -> float:
        stream = await client.acompletion(messages=MESSAGES, max_tokens=6, stream=True)
        chunks.extend([chunk async for chunk in stream])
        return 1.0

    assert run_episode(gateway, agent, protocol).completions == 1
    # How many pieces the text comes in is the gateway's and the tokenizer's business (bytes of
    # one character arrive together): what counts is that the pieces add up to the reply.
    assert all(isinstance(c, litellm.ModelResponseStream) for c in chunks)
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    texts = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
    rebuilt = litellm.stream_chunk_builder(chunks)
    assert (rebuilt.choices[0].message.content or "") == "".join(texts)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_forced_tool_calls(gateway: Any, protocol: str) -> None:
    """``tool_choice`` required, a named tool, and a required call streamed."""
    got: dict[str, Any] = {}

    async def agent(task: dict[str, Any], client: LiteLLMClient) -> float:
        tools = [CALC_TOOL, FLIP_TOOL]
        named = {"type": "function", "function": {"name": "flip"}}
        got["required"] = await client.acompletion(
            messages=MESSAGES, max_tokens=128, tools=tools, tool_choice="required"
        )
        got["named"] = await client.acompletion(
            messages=MESSAGES, max_tokens=128, tools=tools, tool_choice=named
        )
        stream = await client.acompletion(
            messages=MESSAGES,
            max_tokens=128,
            tools=[CALC_TOOL],
            tool_choice="required",
            stream=True,
        )
        got["chunks"] = [chunk async for chunk in stream]
        return 1.0

    assert run_episode(gateway, agent, protocol).completions == 3
    required = got["required"].choices[0]
    assert required.finish_reason == "tool_calls"
    name = required.message.tool_calls[0].function.name  # either tool will do
    tool_call(required.message, name, {"calc": ARGS, "flip": FLIP}[name])
    named = got["named"].choices[0]
    assert named.finish_reason == "tool_calls"
    tool_call(named.message, "flip", FLIP)
    streamed = litellm.stream_chunk_builder(got["chunks"]).choices[0]
    assert streamed.finish_reason == "tool_calls"
    assert got["chunks"][-1].choices[0].finish_reason == "tool_calls"
    tool_call(streamed.message, "calc", ARGS)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_tool_round_trip(gateway: Any, protocol: str) -> None:
    """The policy's call (forced: it calls none of its own accord) is run and its result sent
    back with the assistant message as LiteLLM returned it; the second reply answers."""
    got: dict[str, Any] = {}

    async def agent(task: dict[str, Any], client: LiteLLMClient) -> float:
        messages: list[Any] = list(MESSAGES)
        named = {"type": "function", "function": {"name": "calc"}}
        first = await client.acompletion(
            messages=messages, max_tokens=128, tools=[CALC_TOOL], tool_choice=named
        )
        call = tool_call(first.choices[0].message, "calc", ARGS)
        messages.append(first.choices[0].message)
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "result: 4242"})
        second = await client.acompletion(messages=messages, max_tokens=8, tools=[CALC_TOOL])
        got.update(first=first, second=second)
        return 1.0

    assert run_episode(gateway, agent, protocol).completions == 2
    second = got["second"].choices[0]
    assert second.finish_reason in ("length", "stop") and isinstance(second.message.content, str)
    # The call and its result are in the second prompt, which is longer by more than the result.
    first_prompt, second_prompt = (
        got["first"].usage.prompt_tokens,
        got["second"].usage.prompt_tokens,
    )
    assert second_prompt > first_prompt + 5


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_structured_output(gateway: Any, protocol: str) -> None:
    """``response_format`` as a json_schema dict and as a pydantic model (LiteLLM turns both into
    a forced tool on Anthropic); JSON mode (``json_object``) on OpenAI: LiteLLM does not send it to
    Anthropic, which has none."""
    got: dict[str, Any] = {}
    schema = {"name": "answer", "schema": Answer.model_json_schema(), "strict": True}

    async def agent(task: dict[str, Any], client: LiteLLMClient) -> float:
        fmt = {"type": "json_schema", "json_schema": schema}
        got["dict"] = await client.acompletion(
            messages=MESSAGES, max_tokens=128, response_format=fmt
        )
        got["model"] = await client.acompletion(
            messages=MESSAGES, max_tokens=128, response_format=Answer
        )
        if protocol == "openai":  # greedy, so the object most likely closes within the cap
            got["json"] = await client.acompletion(
                messages=MESSAGES,
                max_tokens=128,
                temperature=0,
                response_format={"type": "json_object"},
            )
        return 1.0

    calls = 3 if protocol == "openai" else 2
    assert run_episode(gateway, agent, protocol).completions == calls
    for key in ("dict", "model"):
        choice = got[key].choices[0]
        assert choice.finish_reason == "stop" and not choice.message.tool_calls
        Answer.model_validate_json(choice.message.content)  # the object, not a tool call
    if protocol == "openai":
        choice = got["json"].choices[0]
        text = choice.message.content
        assert text.startswith("{")
        if choice.finish_reason == "stop":  # else cut off by the cap, mid-object
            assert isinstance(json.loads(text), dict)
        else:
            assert choice.finish_reason == "length"


def test_episodes_land_in_their_sessions_with_their_rewards(
    gateway: Any, tasks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four episodes at once, sync and async, both protocols: calls that name only the model
    find their own episode's base URL and key (the machine's variables are not used), and each
    episode's reward arrives. The agent's config carries the episode's endpoint."""
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"):
        monkeypatch.setenv(name, "from-the-machine")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # nothing listens there
    configs: list[dict[str, Any]] = []

    async def async_agent(task: dict[str, Any], model: str, config: dict[str, Any]) -> float:
        configs.append(config)
        await litellm.acompletion(model=f"openai/{model}", messages=MESSAGES, max_tokens=3)
        return float(task["r"])

    def sync_agent(task: dict[str, Any], model: str) -> float:
        litellm.completion(model=f"anthropic/{model}", messages=MESSAGES, max_tokens=3)
        return float(task["r"])

    stats, _ = gateway.run(LiteLLMAdapter(async_agent), tasks[:2])
    assert (stats.finished, stats.failed) == (2, 0), stats.errors
    stats, more = gateway.run(LiteLLMAdapter(sync_agent, protocol="anthropic"), tasks[2:])
    assert (stats.finished, stats.failed) == (2, 0), stats.errors
    assert {k: t.reward for k, t in more.items()} == {"t0": 0.0, "t1": 0.25, "t2": 0.5, "t3": 0.75}
    assert all(t.completions == 1 for t in more.values())
    for config in configs:
        assert config["model_base_url"] == gateway.url + "/v1"
        assert config["model_name"] == gateway.model and config["api_key"] != "from-the-machine"
    assert os.environ["OPENAI_API_KEY"] == "from-the-machine"  # nothing leaked out


def test_the_client_and_a_wrong_protocol(gateway: Any) -> None:
    client = LiteLLMClient("anthropic/m", "http://127.0.0.1:1", "sk-secret", {"max_retries": 0})
    assert "sk-secret" not in repr(client)
    assert client.params == {
        "model": "anthropic/m",
        "api_base": "http://127.0.0.1:1",
        "api_key": "sk-secret",
        "max_retries": 0,
    }
    with pytest.raises(TypeError, match="protocol must be 'openai' or 'anthropic'"):
        LiteLLMAdapter(lambda task, client: 1.0, protocol="gemini")  # type: ignore[arg-type]


def test_litellm_connects_only_to_loopback(gateway: Any) -> None:
    """Both providers, tools and structured output: every lookup and connection of the process
    while the episodes ran was to 127.0.0.1 (Python's audit hooks see every socket)."""

    async def agent(task: dict[str, Any], client: LiteLLMClient) -> float:
        await client.acompletion(
            messages=MESSAGES, max_tokens=128, tools=[CALC_TOOL], tool_choice="required"
        )
        await client.acompletion(messages=MESSAGES, max_tokens=128, response_format=Answer)
        return 1.0

    with watch_sockets() as seen:
        for protocol in PROTOCOLS:
            assert run_episode(gateway, agent, protocol).completions == 2
    assert any(kind == "connect" for kind, _ in seen)  # the watch works: calls were seen
    assert outside(seen) == []


def test_what_litellm_downloads_is_read_from_its_bundled_copies() -> None:
    """What LiteLLM's import runs (``get_model_cost_map``: a download from GitHub, unless told
    otherwise) and what its first Anthropic call with beta headers loads, run again with the
    switches wrapping sets: both read LiteLLM's bundled copies and look up no name."""
    from litellm.anthropic_beta_headers_manager import reload_beta_headers_config
    from litellm.litellm_core_utils.get_model_cost_map import get_model_cost_map

    LiteLLMAdapter(lambda task, client: 1.0)
    with watch_sockets() as seen:
        assert get_model_cost_map(url=litellm.model_cost_map_url)
        assert reload_beta_headers_config()
    assert seen == []


def test_a_litellm_imported_too_early_is_named(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """LiteLLM already imported (as here) without the switches: the download was tried, and
    wrapping says so; the switches are set for what LiteLLM fetches later."""
    for name in STAY_LOCAL:
        monkeypatch.delenv(name, raising=False)
    LiteLLMAdapter(lambda task, client: 1.0)
    assert "litellm was imported before LITELLM_LOCAL_MODEL_COST_MAP was set" in caplog.text
    assert {name: os.environ[name] for name in STAY_LOCAL} == STAY_LOCAL
    caplog.clear()
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "1")  # the user's own value is kept
    LiteLLMAdapter(lambda task, client: 1.0)
    assert caplog.text == "" and os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] == "1"
