"""The gateway's direct tokenizer call gives exactly what transformers' ``encode`` gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from areal.gateway.policy import text_encoder
from areal.plugins.models.tiny import init_tiny

TEXTS = [
    "",
    "Hello, world!",
    "  leading and trailing spaces  \n\n\n",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "naïve café — 東京 🚀",
    '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>',
    "word " * 300,
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path: Path = tmp_path_factory.mktemp("encoder") / "nano"
    init_tiny(path, size="nano", seed=0)
    return AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize("text", TEXTS)
def test_the_direct_call_matches_transformers(tokenizer: Any, text: str) -> None:
    assert text_encoder(tokenizer)(text) == tokenizer.encode(text, add_special_tokens=False)


def test_a_truncating_tokenizer_goes_through_transformers(tokenizer: Any) -> None:
    """transformers turns a ``tokenizer.json``'s truncation off per call; the Rust tokenizer on
    its own would truncate, so the encoder must not call it directly."""
    tokenizer.backend_tokenizer.enable_truncation(max_length=4)
    try:
        text = TEXTS[-1]
        encode = text_encoder(tokenizer)
        assert len(tokenizer.backend_tokenizer.encode(text).ids) == 4  # the trap
        ids = encode(text)
        assert ids == tokenizer.encode(text, add_special_tokens=False) and len(ids) > 4
    finally:
        tokenizer.backend_tokenizer.no_truncation()
