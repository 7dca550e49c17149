"""Tools on a chat template without tool support: said in the system turn, never dropped silently.

The policy's tokenizer here is the tiny model's with SmolLM2-135M-Instruct's chat template, which
has no tools section (it ignores ``tools``), in front of the real embedded engine (the engine
takes token ids, so the template is the gateway's alone: ``--tokenizer DIR``). Agents are the
official openai SDK (Chat Completions, Responses) and anthropic SDK; what the engine was asked
to continue is read from a recording proxy in front of it, token for token.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageFunctionToolCall

from areal.gateway.tools_fallback import renders_tools, system_prompt_tools, tools_block
from areal.host.http_server import ServerThread
from areal.plugins.inference.embedded.server import InferenceServer
from support import eventually
from support.gateway import EngineRecorder, RunningGateway, running_gateway
from support.http import bearer
from support.tool_schemas import FLIP

# SmolLM2-135M-Instruct's chat template, as its tokenizer_config.json has it.
SMOL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SMOL_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM"
FLIP_TOOL: Any = {  # Any: the SDKs type their tool params as TypedDicts
    "type": "function",
    "function": {"name": "flip", "description": "Flip a coin.", "parameters": FLIP},
}
TOOLS_BLOCK_START = "# Tools\n\nYou may call the functions below"
FORCED_OPENING = "<|im_start|>assistant\n<tool_call>\n"


@pytest.fixture(scope="module")
def smol_tokenizer_dir(gateway_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny model's tokenizer with SmolLM2's chat template in place of its own."""
    out = tmp_path_factory.mktemp("smol-template")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(Path(gateway_model_dir) / name, out / name)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = SMOL_TEMPLATE
    config_path.write_text(json.dumps(config))
    assert not (out / "chat_template.jinja").exists()  # would win over tokenizer_config.json
    return str(out)


@pytest.fixture(scope="module")
def smol(
    engine: tuple[str, InferenceServer],
    smol_tokenizer_dir: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[RunningGateway, EngineRecorder]]:
    """A gateway rendering with SmolLM2's template, its engine calls kept by a recorder."""
    url, server = engine
    recorder = EngineRecorder(url)
    proxy = ServerThread(recorder.app(), "127.0.0.1", 0).start()
    logs = tmp_path_factory.mktemp("smol-logs")
    try:
        with running_gateway(proxy.url, server, logs, tokenizer=smol_tokenizer_dir) as gw:
            yield gw, recorder
    finally:
        proxy.stop()


def last_prompt(recorder: EngineRecorder, tokenizer: Any) -> str:
    """The text of the prompt the engine was last asked to continue."""
    return str(tokenizer.decode(recorder.generate_bodies[-1]["input_ids"]))


def fallback_count(gw: RunningGateway) -> int:
    """``GET /rl/sessions``' count of requests whose tools went into the system turn."""
    resp = httpx.get(f"{gw.url}/rl/sessions", headers=bearer(gw.admin), timeout=30)
    assert resp.status_code == 200, resp.text
    counts: dict[str, int] = resp.json()["tools_fallback"]
    return counts.get("system_prompt", 0)


def log_line(gw: RunningGateway, session_id: str, path: str) -> str:
    """The gateway.log line of the session's call to ``path`` (it is written as the call ends)."""

    def line() -> str | None:
        text = (gw.log_dir / "gateway.log").read_text()
        return next(
            (x for x in text.splitlines() if f"session={session_id}" in x and x.endswith(path)),
            None,
        )

    found: str = eventually(line, 30, f"the gateway.log line of {session_id}'s call to {path}")
    return found


def test_the_probe_tells_the_two_templates_apart(tokenizer: Any, smol_tokenizer_dir: str) -> None:
    from transformers import AutoTokenizer

    smol_tokenizer = AutoTokenizer.from_pretrained(smol_tokenizer_dir)
    chat = [{"role": "user", "content": "hi"}]
    plain = smol_tokenizer.apply_chat_template(chat, tokenize=False)
    # the problem: SmolLM2's template renders a chat with tools exactly as one without
    assert smol_tokenizer.apply_chat_template(chat, tools=[FLIP_TOOL], tokenize=False) == plain
    assert renders_tools(smol_tokenizer) is False
    assert renders_tools(tokenizer) is True  # the tiny model's own template has a tools section


class RaisingTemplate:
    """A template that refuses what ``refuses`` says: tools, or any chat at all."""

    def __init__(self, refuses: str) -> None:
        self.refuses = refuses

    def apply_chat_template(self, messages: Any, tools: Any = None, **_: Any) -> str:
        if self.refuses == "everything" or (tools and self.refuses == "tools"):
            raise ValueError(f"this template refuses {self.refuses}")
        return "".join(m["content"] for m in messages)


def test_a_template_that_refuses_tools_renders_none() -> None:
    assert renders_tools(RaisingTemplate("tools")) is False
    # one that cannot render the probe chat at all is left alone: its own error reaches clients
    assert renders_tools(RaisingTemplate("everything")) is True


def test_the_fallback_merges_into_the_agents_system_turn() -> None:
    chat: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Flip twice."},
        {
            "role": "assistant",
            "content": "Flipping.",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "flip", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "flip", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "heads"},
        {"role": "tool", "tool_call_id": "b", "content": "tails"},
        {"role": "user", "content": "And?"},
    ]
    call = '<tool_call>\n{"name": "flip", "arguments": {}}\n</tool_call>'
    assert system_prompt_tools(chat, [FLIP_TOOL]) == [
        {"role": "system", "content": "Be brief.\n\n" + tools_block([FLIP_TOOL])},
        {"role": "user", "content": "Flip twice."},
        {"role": "assistant", "content": f"Flipping.\n{call}\n{call}"},
        {
            "role": "user",
            "content": "<tool_response>\nheads\n</tool_response>\n"
            "<tool_response>\ntails\n</tool_response>",
        },
        {"role": "user", "content": "And?"},
    ]


def test_chat_completions_forced_call_then_the_next_turn_merges(
    smol: tuple[RunningGateway, EngineRecorder], tokenizer: Any
) -> None:
    gw, recorder = smol
    session = gw.open_session()
    agent = openai.OpenAI(base_url=gw.v1, api_key=session["api_key"], max_retries=0)
    before = fallback_count(gw)
    question: list[Any] = [{"role": "user", "content": "Heads or tails?"}]
    reply = agent.chat.completions.create(
        model=gw.model,
        messages=question,
        tools=[FLIP_TOOL],
        tool_choice={"type": "function", "function": {"name": "flip"}},
        seed=1,
    )
    prompt = last_prompt(recorder, tokenizer)
    block = prompt.index(TOOLS_BLOCK_START)
    # a system turn of its own, holding the tools block (SmolLM2's default one is not rendered)
    assert prompt.startswith("<|im_start|>system\n# Tools\n") and block > 0
    assert SMOL_DEFAULT_SYSTEM not in prompt
    assert "<tools>\n" + json.dumps(FLIP_TOOL) + "\n</tools>" in prompt
    assert prompt.endswith(FORCED_OPENING)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = (choice.message.tool_calls or [])[0]
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    assert call.function.name == "flip"
    assert isinstance(json.loads(call.function.arguments)["heads"], bool)
    assert "tools_fallback=system_prompt" in log_line(
        gw, session["session_id"], "/chat/completions"
    )
    assert fallback_count(gw) == before + 1

    # the agent sends the call back (content null) with its result: the turn extends the last
    history: list[Any] = [
        *question,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "heads"},
    ]
    agent.chat.completions.create(
        model=gw.model,
        messages=history,
        tools=[FLIP_TOOL],
        max_tokens=4,
    )
    prompt = last_prompt(recorder, tokenizer)
    sent_back = (
        f'<tool_call>\n{{"name": "flip", "arguments": {call.function.arguments}}}\n</tool_call>'
    )
    assert f"<|im_start|>assistant\n{sent_back}<|im_end|>\n" in prompt
    assert "<|im_start|>user\n<tool_response>\nheads\n</tool_response><|im_end|>\n" in prompt
    trace = httpx.get(
        f"{gw.url}/rl/sessions/{session['session_id']}/trace",
        headers=bearer(session["api_key"]),
        timeout=30,
    ).json()
    assert [t["join"] for t in trace["turns"]] == ["start", "merged"], trace
    recorded = gw.state.sessions.lookup(session["api_key"]).completions
    assert recorded[-1].prompt_ids == recorder.generate_bodies[-1]["input_ids"]


def test_streamed_chat_completions_forced_call(
    smol: tuple[RunningGateway, EngineRecorder],
) -> None:
    gw, _ = smol
    agent = openai.OpenAI(base_url=gw.v1, api_key=gw.key, max_retries=0)
    stream = agent.chat.completions.create(
        model=gw.model,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Flip."}],
        tools=[FLIP_TOOL],
        tool_choice="required",
        stream=True,
    )
    names, arguments, finish = "", "", None
    for chunk in stream:
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                names += (d.function.name or "") if d.function else ""
                arguments += (d.function.arguments or "") if d.function else ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls" and names == "flip"
    assert isinstance(json.loads(arguments)["heads"], bool)


def test_responses_forced_call(smol: tuple[RunningGateway, EngineRecorder], tokenizer: Any) -> None:
    gw, recorder = smol
    session = gw.open_session()
    agent = openai.OpenAI(base_url=gw.v1, api_key=session["api_key"], max_retries=0)
    before = fallback_count(gw)
    response = agent.responses.create(
        model=gw.model,
        instructions="Be brief.",
        input="Heads or tails?",
        tools=[{"type": "function", "name": "flip", "parameters": FLIP, "strict": True}],
        tool_choice={"type": "function", "name": "flip"},
    )
    prompt = last_prompt(recorder, tokenizer)
    # the instructions are the system turn; the tools block follows them after a blank line
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n" + TOOLS_BLOCK_START)
    assert prompt.endswith(FORCED_OPENING)
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "flip"
    assert isinstance(json.loads(calls[0].arguments)["heads"], bool)
    assert "tools_fallback=system_prompt" in log_line(gw, session["session_id"], "/responses")
    assert fallback_count(gw) == before + 1


def test_anthropic_messages_forced_call(
    smol: tuple[RunningGateway, EngineRecorder], tokenizer: Any
) -> None:
    gw, recorder = smol
    session = gw.open_session()
    before = fallback_count(gw)
    request: dict[str, Any] = {
        "model": gw.model,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Heads or tails?"}],
        "tools": [{"name": "flip", "description": "Flip a coin.", "input_schema": FLIP}],
        "tool_choice": {"type": "tool", "name": "flip"},
    }
    with anthropic.Anthropic(
        base_url=gw.url, api_key=session["api_key"], max_retries=0, timeout=60
    ) as agent:
        message = agent.messages.create(max_tokens=64, **request)
        counted = agent.messages.count_tokens(**request)
    sent = recorder.generate_bodies[-1]["input_ids"]
    assert counted.input_tokens == len(sent)  # the count renders the same fallback prompt
    prompt = str(tokenizer.decode(sent))
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n" + TOOLS_BLOCK_START)
    assert prompt.endswith(FORCED_OPENING)
    assert message.stop_reason == "tool_use"
    uses = [block for block in message.content if block.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "flip"
    assert isinstance(uses[0].input, dict) and isinstance(uses[0].input["heads"], bool)
    assert "tools_fallback=system_prompt" in log_line(gw, session["session_id"], "/messages")
    assert fallback_count(gw) == before + 2  # the message and its token count


def test_a_chat_without_tools_renders_as_the_template_says(
    smol: tuple[RunningGateway, EngineRecorder], tokenizer: Any
) -> None:
    gw, recorder = smol
    session = gw.open_session()
    agent = openai.OpenAI(base_url=gw.v1, api_key=session["api_key"], max_retries=0)
    before = fallback_count(gw)
    agent.chat.completions.create(
        model=gw.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    prompt = last_prompt(recorder, tokenizer)
    assert prompt.startswith(f"<|im_start|>system\n{SMOL_DEFAULT_SYSTEM}")
    assert "# Tools" not in prompt
    assert "tools_fallback" not in log_line(gw, session["session_id"], "/chat/completions")
    assert fallback_count(gw) == before


def test_the_fallback_is_logged_once_at_warning(
    start_gateway: Any, smol_tokenizer_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="areal.gateway.policy")
    with start_gateway(tokenizer=smol_tokenizer_dir) as gw:
        agent = openai.OpenAI(base_url=gw.v1, api_key=gw.key, max_retries=0)
        for _ in range(2):
            agent.chat.completions.create(
                model=gw.model,
                messages=[{"role": "user", "content": "Flip."}],
                tools=[FLIP_TOOL],
                max_tokens=2,
            )
        assert fallback_count(gw) == 2
    warnings = [r for r in caplog.records if "does not render tools" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert "Tools on a template without tool support" in warnings[0].getMessage()
    assert "tool parser" not in warnings[0].getMessage()  # hermes reads the fallback's calls


def test_a_template_with_tools_uses_no_fallback(gateway: RunningGateway, tokenizer: Any) -> None:
    session = gateway.open_session()
    agent = openai.OpenAI(base_url=gateway.v1, api_key=session["api_key"], max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "Heads or tails?"}]
    reply = agent.chat.completions.create(
        model=gateway.model,
        messages=messages,
        tools=[FLIP_TOOL],
        tool_choice="required",
    )
    call = (reply.choices[0].message.tool_calls or [])[0]
    assert isinstance(call, ChatCompletionMessageFunctionToolCall) and call.function.name == "flip"
    recorded = gateway.state.sessions.lookup(session["api_key"]).completions[-1]
    # the template's own tools section, exactly as it renders it
    own = tokenizer.apply_chat_template(
        messages, tools=[FLIP_TOOL], tokenize=False, add_generation_prompt=True
    )
    assert tokenizer.decode(recorded.prompt_ids) == own + "<tool_call>\n"
    assert "tools_fallback" not in log_line(gateway, session["session_id"], "/chat/completions")
    assert fallback_count(gateway) == 0
