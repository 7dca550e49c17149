"""The embedded default's tokenizer, loaded the way every consumer loads it: AutoTokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal.plugins.models.tokenizer import (
    EOS_TOKEN_ID,
    PAD_TOKEN_ID,
    SPECIAL_TOKENS,
    build_tokenizer,
    special_token_ids,
)

VOCAB_SIZE = 4096

# The documented ids; a change here breaks every checkpoint built with the old tokenizer.
EXPECTED_IDS = {
    "<|endoftext|>": 0,
    "<|im_start|>": 1,
    "<|im_end|>": 2,
    "<tool_call>": 3,
    "</tool_call>": 4,
    "<tool_response>": 5,
    "</tool_response>": 6,
    "<think>": 7,
    "</think>": 8,
}

ROUND_TRIP_TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "  leading spaces, trailing spaces   \n\n\ttabs\r\nCRLF\n",
    "café naïve Ångström — “quotes” ‘single’ … ½ ∑ ∞",
    "Привет, мир! 日本語のテキスト 你好世界 안녕하세요 مرحبا שלום",
    "emoji: 😀🚀👍🏽 👨‍👩‍👧 ❤️ 🇫🇷",
    "e\u0301 (combining acute) and \u200b zero width and \x00\x07 control",
    'def f(x: int) -> dict:\n    return {"a": [1, 2.5, None], "b": f"{x!r}"}\n',
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}',
    "3.14159 + 2,718 = 1e-10; 0x1F; 10**9",
    "",
]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}

TOOLS_SYSTEM_TAIL = (
    "\n\n# Tools\n\n"
    "You may call the functions below to help with the request. "
    "Their signatures are listed inside <tools></tools>:\n"
    "<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}\n'
    "</tools>\n\n"
    "To call a function, answer with a JSON object holding its name and arguments inside "
    "<tool_call></tool_call> tags, one block per call:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <arguments-json-object>}\n'
    "</tool_call><|im_end|>\n"
)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(out, vocab_size=VOCAB_SIZE)
    return out


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(tokenizer_dir)


def test_directory_holds_a_standard_tokenizer(tokenizer_dir: Path) -> None:
    files = {path.name for path in tokenizer_dir.iterdir()}
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= files
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>"
    assert config["pad_token"] == "<|endoftext|>"
    assert config["clean_up_tokenization_spaces"] is False
    assert config["model_max_length"] > 0
    assert "<|im_start|>" in config["chat_template"]


def test_loads_as_fast_tokenizer(tokenizer) -> None:
    assert tokenizer.is_fast
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.bos_token is None
    assert len(tokenizer) <= VOCAB_SIZE
    # The trainer fills the budget, so the embedding rows are all used.
    assert len(tokenizer) > VOCAB_SIZE // 2


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_any_text_round_trips_exactly(tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert all(0 <= i < len(tokenizer) for i in ids)
    assert tokenizer.decode(ids) == text


def test_common_text_compresses(tokenizer) -> None:
    text = "The answer is the number of people who live in the city."
    # Whole common words, not bytes: fewer tokens than a quarter of the characters.
    assert len(tokenizer.encode(text, add_special_tokens=False)) < len(text) / 4


def test_special_tokens_are_single_ids_at_documented_positions(tokenizer) -> None:
    assert special_token_ids() == EXPECTED_IDS
    assert list(SPECIAL_TOKENS) == list(EXPECTED_IDS)
    assert (PAD_TOKEN_ID, EOS_TOKEN_ID) == (0, 2)
    assert tokenizer.eos_token_id == 2
    assert tokenizer.pad_token_id == 0
    for token, token_id in EXPECTED_IDS.items():
        assert tokenizer.convert_tokens_to_ids(token) == token_id
        assert tokenizer.encode(token, add_special_tokens=False) == [token_id]
        assert tokenizer.encode(f"a{token}b", add_special_tokens=False).count(token_id) == 1


def test_skip_special_tokens_keeps_tool_markers(tokenizer) -> None:
    text = "<|im_start|>assistant\n<think>\nok\n</think>\n<tool_call>\n{}\n</tool_call><|im_end|>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == (
        "assistant\n<think>\nok\n</think>\n<tool_call>\n{}\n</tool_call>"
    )


def test_build_is_deterministic(tmp_path: Path) -> None:
    build_tokenizer(tmp_path / "a", vocab_size=VOCAB_SIZE)
    build_tokenizer(tmp_path / "b", vocab_size=VOCAB_SIZE)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_small_vocab_fits_and_still_round_trips(tmp_path: Path, tokenizer_dir: Path) -> None:
    from tokenizers import Tokenizer

    build_tokenizer(tmp_path, vocab_size=512)
    small = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert small.get_vocab_size(with_added_tokens=True) <= 512
    assert small.token_to_id("<|im_end|>") == 2
    text = ROUND_TRIP_TEXTS[4] + ROUND_TRIP_TEXTS[6]
    assert small.decode(small.encode(text).ids) == text


def test_vocab_below_bytes_plus_specials_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        build_tokenizer(tmp_path, vocab_size=200)


# --- chat template ---------------------------------------------------------------------------


def _render(tokenizer, messages, **kwargs) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


def test_system_user_generation_prompt(tokenizer) -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
    ]
    assert _render(tokenizer, messages, add_generation_prompt=True) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert _render(tokenizer, messages) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    )


def test_no_system_turn_without_system_or_tools(tokenizer) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    assert _render(tokenizer, messages) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
    )


def _tool_episode(arguments_paris, arguments_oslo) -> list[dict]:
    return [
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments_paris},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments_oslo},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 18}'},
        {"role": "tool", "tool_call_id": "call_2", "content": '{"temp_c": 9}'},
        {"role": "assistant", "content": "Paris: 18 °C. Oslo: 9 °C."},
    ]


EXPECTED_TOOL_EPISODE = (
    "<|im_start|>system\nYou are a helpful assistant." + TOOLS_SYSTEM_TAIL + "<|im_start|>user\n"
    "Weather in Paris and Oslo?<|im_end|>\n"
    "<|im_start|>assistant\n"
    "<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    "</tool_call>\n"
    "<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "<tool_response>\n"
    '{"temp_c": 18}\n'
    "</tool_response>\n"
    "<tool_response>\n"
    '{"temp_c": 9}\n'
    "</tool_response><|im_end|>\n"
    "<|im_start|>assistant\nParis: 18 °C. Oslo: 9 °C.<|im_end|>\n"
)


def test_tool_calls_and_grouped_tool_results(tokenizer) -> None:
    as_dicts = _tool_episode({"city": "Paris"}, {"city": "Oslo", "days": 2})
    as_strings = _tool_episode('{"city": "Paris"}', '{"city": "Oslo", "days": 2}')
    assert _render(tokenizer, as_dicts, tools=[WEATHER_TOOL]) == EXPECTED_TOOL_EPISODE
    assert _render(tokenizer, as_strings, tools=[WEATHER_TOOL]) == EXPECTED_TOOL_EPISODE


def test_assistant_text_before_tool_call_and_flat_call_shape(tokenizer) -> None:
    messages = [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [{"name": "get_weather", "arguments": {"city": "Lima"}}],
        },
        {"role": "tool", "content": "sunny"},
    ]
    assert _render(tokenizer, messages, tools=[WEATHER_TOOL], add_generation_prompt=True) == (
        "<|im_start|>system\nUse tools."
        + TOOLS_SYSTEM_TAIL
        + "<|im_start|>user\nWeather?<|im_end|>\n"
        "<|im_start|>assistant\nLet me check.\n"
        "<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Lima"}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_content_as_text_parts(tokenizer) -> None:
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Part one. "},
                {"type": "text", "text": "Part two."},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
    ]
    assert _render(tokenizer, messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nPart one. Part two.<|im_end|>\n"
        "<|im_start|>assistant\nDone.<|im_end|>\n"
    )


def test_non_text_parts_are_refused(tokenizer) -> None:
    from jinja2.exceptions import TemplateError

    image = {"type": "image_url", "image_url": {"url": "http://x/y.png"}}
    with pytest.raises(TemplateError, match="image_url"):
        _render(tokenizer, [{"role": "user", "content": [image]}])


def test_history_extends_previous_prompt_and_output(tokenizer) -> None:
    """Turn merging relies on this: prompt + model output is a prefix of the next prompt."""
    first = [{"role": "user", "content": "Weather in Paris and Oslo?"}]
    prompt = _render(tokenizer, first, tools=[WEATHER_TOOL], add_generation_prompt=True)
    output = (
        "<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call>\n"
        "<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n'
        "</tool_call><|im_end|>"
    )
    assert EXPECTED_TOOL_EPISODE.startswith(prompt + output)
    prompt_ids = tokenizer.encode(prompt + output, add_special_tokens=False)
    full_ids = tokenizer.encode(EXPECTED_TOOL_EPISODE, add_special_tokens=False)
    assert full_ids[: len(prompt_ids)] == prompt_ids


def test_rendered_markers_encode_as_single_ids(tokenizer) -> None:
    text = _render(tokenizer, _tool_episode({"city": "Paris"}, {"city": "Oslo", "days": 2}))
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert ids[0] == EXPECTED_IDS["<|im_start|>"]
    counts = {token: ids.count(token_id) for token, token_id in EXPECTED_IDS.items()}
    assert counts == {
        "<|endoftext|>": 0,
        "<|im_start|>": 4,
        "<|im_end|>": 4,
        "<tool_call>": 2,
        "</tool_call>": 2,
        "<tool_response>": 2,
        "</tool_response>": 2,
        "<think>": 0,
        "</think>": 0,
    }
    # No marker leaks out as ordinary pieces of text.
    for token_id in ids:
        if token_id >= len(SPECIAL_TOKENS):
            piece = tokenizer.decode([token_id])
            assert "<|" not in piece
            assert "tool_call>" not in piece
