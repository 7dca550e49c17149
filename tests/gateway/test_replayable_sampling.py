"""A call recorded for training asks the sampler only for what the trainer replays.

The trainer recomputes a token's behaviour log-prob as log softmax(z / T) over the whole
vocabulary. Penalties and ``logit_bias`` change z, so a recorded call that sends one is refused
(400 in the protocol's schema, naming the field) before any engine sees it; a call outside
training passes them on. A training run's sampling (``override_client_sampling``) replaces a
client's temperature and top-p and drops its top-k and min-p: the sample records what was used,
and every override is logged and counted. All through the real SDKs against a real gateway.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from areal.gateway.replayable import NOT_TRAINABLE
from areal.host.http_server import ServerThread
from areal.plugins.inference.embedded.server import InferenceServer
from areal.run.gateway_client import GatewayAdmin
from support.gateway import POLICY, EngineRecorder, RunningGateway, running_gateway
from support.http import bearer

CHAT: list[Any] = [{"role": "user", "content": "Say hi."}]
UNREPLAYED = [
    ("frequency_penalty", {"frequency_penalty": 0.5}),
    ("presence_penalty", {"presence_penalty": -0.3}),
    ("repetition_penalty", {"extra_body": {"repetition_penalty": 1.2}}),
    ("logit_bias", {"logit_bias": {"5": 3.0}}),
]
NEUTRAL: dict[str, Any] = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "logit_bias": {"5": 0},
    "extra_body": {"repetition_penalty": 1.0},
}


def _gateway(
    engine: tuple[str, InferenceServer], log_dir: Path, route: dict[str, Any] | None = None
) -> Iterator[tuple[RunningGateway, EngineRecorder]]:
    """A gateway whose engine calls pass through an :class:`EngineRecorder`; ``route``: the
    policy route's extra settings."""
    url, server = engine
    recorder = EngineRecorder(url)
    proxy = ServerThread(recorder.app(), "127.0.0.1", 0).start()
    policy = {"model_id": POLICY, "max_tokens": 256, **(route or {})}
    try:
        with running_gateway(
            proxy.url, server, log_dir, {"model_routing": {"policy_model": policy}}
        ) as gw:
            yield gw, recorder
    finally:
        proxy.stop()


@pytest.fixture(scope="module")
def recorded(
    engine: tuple[str, InferenceServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningGateway, EngineRecorder]]:
    """The client's sampling honoured (``sampling.honor_client``)."""
    yield from _gateway(engine, tmp_path_factory.mktemp("replayable-logs"))


@pytest.fixture(scope="module")
def run_sampling(
    engine: tuple[str, InferenceServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningGateway, EngineRecorder]]:
    """A training run's route: its own temperature and top-p replace the client's."""
    route = {"override_client_sampling": True, "temperature": 0.7, "top_p": 0.9}
    yield from _gateway(engine, tmp_path_factory.mktemp("run-sampling-logs"), route)


def _session(gateway: RunningGateway) -> dict[str, Any]:
    opened = asyncio.run(GatewayAdmin(gateway.url, gateway.admin).open_session())
    return dict(opened)


def _agent(gateway: RunningGateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.v1, api_key=key, max_retries=0)


@pytest.mark.parametrize(("field", "option"), UNREPLAYED, ids=[f for f, _ in UNREPLAYED])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_recorded_call_that_changes_the_logits_is_refused_naming_the_field(
    recorded: tuple[RunningGateway, EngineRecorder],
    field: str,
    option: dict[str, Any],
    stream: bool,
) -> None:
    gateway, recorder = recorded
    session = _session(gateway)
    sent = len(recorder.generate_bodies)
    with pytest.raises(openai.BadRequestError) as refused:
        _agent(gateway, session["api_key"]).chat.completions.create(
            model=gateway.model, messages=CHAT, max_tokens=4, stream=stream, **option
        )
    error = refused.value.body
    assert isinstance(error, dict), error
    assert error["param"] == field and error["code"] == NOT_TRAINABLE, error
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"{field}: this call is recorded for training"), error
    assert len(recorder.generate_bodies) == sent, "a refused call reached the engine"
    assert gateway.state.sessions.lookup(session["api_key"]).completions == []


def test_neutral_values_are_no_change_and_are_served_in_training(
    recorded: tuple[RunningGateway, EngineRecorder],
) -> None:
    gateway, recorder = recorded
    session = _session(gateway)
    reply = _agent(gateway, session["api_key"]).chat.completions.create(
        model=gateway.model, messages=CHAT, max_tokens=4, **NEUTRAL
    )
    assert reply.choices[0].finish_reason in ("stop", "length")
    sent = recorder.generate_bodies[-1]["sampling_params"]
    assert not {"frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias"} & set(
        sent
    ), sent
    assert len(gateway.state.sessions.lookup(session["api_key"]).completions) == 1


def test_outside_training_penalties_and_logit_bias_reach_the_engine(
    recorded: tuple[RunningGateway, EngineRecorder],
) -> None:
    """A plain-key call is not recorded: the gateway passes the fields on (the embedded engine
    itself refuses them, as its sampler has none: that refusal is the engine's, not ours)."""
    gateway, recorder = recorded
    client = _agent(gateway, gateway.key)
    for field, option in UNREPLAYED:
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model=gateway.model, messages=CHAT, max_tokens=4, **option
            )
        assert refused.value.body["code"] != NOT_TRAINABLE  # type: ignore[index]
        assert "the inference engine refused" in refused.value.body["message"]  # type: ignore[index]
        assert field in recorder.generate_bodies[-1]["sampling_params"], field


def test_anthropic_and_responses_pass_no_penalty_on(
    recorded: tuple[RunningGateway, EngineRecorder],
) -> None:
    """Neither protocol has penalties or a logit bias: such keys in their bodies are ignored and
    never reach the engine, in training or not."""
    gateway, recorder = recorded
    session = _session(gateway)
    extra = {"frequency_penalty": 0.5, "repetition_penalty": 1.3, "logit_bias": {"5": 2.0}}
    with anthropic.Anthropic(
        base_url=gateway.url, api_key=session["api_key"], max_retries=0, timeout=60
    ) as claude:
        claude.messages.create(model=gateway.model, max_tokens=4, messages=CHAT, extra_body=extra)
    assert not set(extra) & set(recorder.generate_bodies[-1]["sampling_params"])
    _agent(gateway, session["api_key"]).responses.create(
        model=gateway.model, input="hi", max_output_tokens=4, extra_body=extra
    )
    assert not set(extra) & set(recorder.generate_bodies[-1]["sampling_params"])
    assert len(gateway.state.sessions.lookup(session["api_key"]).completions) == 2


def test_honoured_top_k_and_min_p_are_sent_and_recorded(
    recorded: tuple[RunningGateway, EngineRecorder],
) -> None:
    """Truncation only chooses the token; the sample records it (the trainer's temperature rule
    reads top-k 1 as greedy), and the engines report the full-vocabulary value."""
    gateway, recorder = recorded
    session = _session(gateway)
    agent = _agent(gateway, session["api_key"])
    agent.chat.completions.create(
        model=gateway.model,
        messages=CHAT,
        max_tokens=4,
        temperature=0.7,
        extra_body={"top_k": 20, "min_p": 0.05},
    )
    sent = recorder.generate_bodies[-1]["sampling_params"]
    assert (sent["top_k"], sent["min_p"], sent["temperature"]) == (20, 0.05, 0.7)
    turn = gateway.state.sessions.lookup(session["api_key"]).completions[-1]
    assert turn.sampling["top_k"] == 20 and turn.sampling["min_p"] == 0.05
    assert turn.temperature == 0.7
    # One candidate is greedy: sent as temperature 0, so every engine reports the plain
    # log-softmax, the value the trainer recomputes for it.
    agent.chat.completions.create(
        model=gateway.model, messages=CHAT, max_tokens=4, temperature=0.7, extra_body={"top_k": 1}
    )
    assert recorder.generate_bodies[-1]["sampling_params"]["temperature"] == 0.0
    assert gateway.state.sessions.lookup(session["api_key"]).completions[-1].temperature == 1.0


def test_the_run_sampling_replaces_the_clients_and_counts_each_override(
    run_sampling: tuple[RunningGateway, EngineRecorder], caplog: pytest.LogCaptureFixture
) -> None:
    gateway, recorder = run_sampling
    session = _session(gateway)
    agent = _agent(gateway, session["api_key"])
    with caplog.at_level("INFO", logger="areal.gateway.policy"):
        for _ in range(2):
            agent.chat.completions.create(
                model=gateway.model,
                messages=CHAT,
                max_tokens=4,
                temperature=1.3,
                extra_body={"top_k": 20, "min_p": 0.05},
            )
    sent = recorder.generate_bodies[-1]["sampling_params"]
    assert sent["temperature"] == 0.7 and sent["top_p"] == 0.9
    assert "top_k" not in sent and "min_p" not in sent
    turn = gateway.state.sessions.lookup(session["api_key"]).completions[-1]
    assert (turn.sampling["temperature"], turn.sampling["top_p"]) == (0.7, 0.9)
    assert (turn.sampling["top_k"], turn.sampling["min_p"]) == (-1, 0.0)  # what was used
    logged = [r.getMessage() for r in caplog.records if "the run's sampling applies" in r.message]
    assert sorted(m.split("=")[0].split()[-1] for m in logged) == [
        "min_p",
        "temperature",
        "top_k",
    ]  # each distinct value once
    listing = httpx.get(f"{gateway.url}/rl/sessions", headers=bearer(gateway.admin)).json()
    assert listing["sampling_overridden"] == {"temperature": 2, "top_k": 2, "min_p": 2}
    # Anthropic's top_k is dropped and counted alike.
    with anthropic.Anthropic(
        base_url=gateway.url, api_key=session["api_key"], max_retries=0, timeout=60
    ) as claude:
        claude.messages.create(
            model=gateway.model, max_tokens=4, messages=CHAT, extra_body={"top_k": 5}
        )
    assert "top_k" not in recorder.generate_bodies[-1]["sampling_params"]
    listing = httpx.get(f"{gateway.url}/rl/sessions", headers=bearer(gateway.admin)).json()
    assert listing["sampling_overridden"]["top_k"] == 3


def test_a_grammar_on_sglang_is_counted_and_logged_as_masked_logprobs(
    engine: tuple[str, InferenceServer],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SGLang takes a token's log-prob after the grammar's mask: a forced token's reported value
    is not the one the trainer recomputes. Nothing refuses it (forced tool calls are what agents
    are trained on), so every such call is counted per backend and the first one logged. The
    embedded server speaks SGLang's native protocol, so it stands in as the engine here; the
    accounting reads the backend the pool has for it."""
    url, server = engine
    schema = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    with running_gateway(url, server, tmp_path, engine_backend="sglang") as gateway:
        session = _session(gateway)
        agent = _agent(gateway, session["api_key"])
        with caplog.at_level("WARNING", logger="areal.gateway.policy"):
            for _ in range(2):
                agent.chat.completions.create(
                    model=gateway.model, messages=CHAT, max_tokens=4, response_format=schema
                )
            agent.chat.completions.create(model=gateway.model, messages=CHAT, max_tokens=4)
            # a forced tool call is constrained too (its structural tag)
            agent.chat.completions.create(
                model=gateway.model,
                messages=CHAT,
                max_tokens=4,
                tools=[{"type": "function", "function": {"name": "noop"}}],
                tool_choice="required",
            )
        listing = httpx.get(f"{gateway.url}/rl/sessions", headers=bearer(gateway.admin)).json()
    assert listing["masked_logprobs"] == {"sglang": 3}
    warned = [r.getMessage() for r in caplog.records if "after the grammar's mask" in r.message]
    assert len(warned) == 1 and warned[0].startswith("sglang reports"), warned


def test_a_grammar_on_the_embedded_engine_is_not_counted(
    recorded: tuple[RunningGateway, EngineRecorder],
) -> None:
    gateway, _ = recorded
    session = _session(gateway)
    schema = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    _agent(gateway, session["api_key"]).chat.completions.create(
        model=gateway.model, messages=CHAT, max_tokens=4, response_format=schema
    )
    listing = httpx.get(f"{gateway.url}/rl/sessions", headers=bearer(gateway.admin)).json()
    assert listing["masked_logprobs"] == {}
