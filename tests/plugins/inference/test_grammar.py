"""Constrained decoding: random logits, masked by the grammar, must still yield valid output."""

from __future__ import annotations

import json
import random
import re

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from areal.plugins.inference.embedded.grammar import (
    ANY_JSON,
    GrammarCompiler,
    GrammarError,
    GrammarMatcher,
    GrammarSpec,
    grammar_spec_from_sampling_params,
)

PADDING_IDS = 64
MAX_STEPS = 400
CLOSERS = ('"', "}", "]", ",")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
    },
    "required": ["name", "age", "color", "tags"],
}
REGEX = r"[a-z]{2,8}@[a-z]{2,6}\.(com|org)"
EBNF = """
root ::= cmd (";" cmd)*
cmd ::= ("add" | "sub") " " num
num ::= [1-9] [0-9]? [0-9]?
"""


CLOSING = "\n</tool_call>"
# A tool call's JSON whose every value is fixed text or a number, so its exact text is json.dumps's.
CALL = {
    "type": "object",
    "properties": {
        "name": {"const": "paint"},
        "arguments": {
            "type": "object",
            "properties": {
                "color": {"enum": ["red", "green", "blue"]},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                "tags": {"type": "array", "items": {"enum": ["add", "sub"]}, "maxItems": 3},
            },
            "required": ["color", "age", "tags"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}


def _tag(schema: dict[str, object], closing: str = CLOSING) -> dict[str, object]:
    """The gateway's structural tag for a forced call: the call's JSON, then its closing text."""
    elements = [{"type": "json_schema", "json_schema": schema}]
    return {
        "type": "structural_tag",
        "format": {
            "type": "sequence",
            "elements": [*elements, {"type": "const_string", "value": closing}],
        },
    }


def _corpus() -> list[str]:
    rng = random.Random(7)
    words = ["alpha", "beta", "red", "green", "blue", "add", "sub", "name", "age", "tags"]
    lines = []
    for _ in range(300):
        record = {
            "name": rng.choice(words),
            "age": rng.randint(0, 300),
            "tags": rng.sample(words, rng.randint(0, 3)),
            "ok": rng.random() < 0.5,
            "x": None,
        }
        lines.append(json.dumps(record))
        lines.append(f"{rng.choice(words)}@{rng.choice(words)}.com add {rng.randint(1, 999)};")
    return lines


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420,
        special_tokens=["<|im_end|>", "<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(_corpus(), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>")


@pytest.fixture(scope="module")
def vocab_size(tokenizer: PreTrainedTokenizerFast) -> int:
    return len(tokenizer) + PADDING_IDS


@pytest.fixture(scope="module")
def compiler(tokenizer: PreTrainedTokenizerFast, vocab_size: int) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, vocab_size)


@pytest.fixture(scope="module")
def closer_bias(tokenizer: PreTrainedTokenizerFast, vocab_size: int) -> torch.Tensor:
    """Favour tokens that close things, so random walks end within the step cap.

    The mask must still forbid them wherever the grammar does (a `}` before a required field).
    """
    bias = torch.zeros(vocab_size)
    for token_id in range(len(tokenizer)):
        if any(c in tokenizer.decode([token_id]) for c in CLOSERS):
            bias[token_id] = 4.0
    bias[tokenizer.eos_token_id] = 8.0
    return bias


def _generate(
    compiler: GrammarCompiler,
    tokenizer: PreTrainedTokenizerFast,
    bias: torch.Tensor,
    spec: GrammarSpec,
    seeds: range,
) -> list[str]:
    """Decode one batch, one row per seed: mask -> sample -> accept until every row terminates."""
    matchers: list[GrammarMatcher | None] = [compiler.new_matcher(spec) for _ in seeds]
    masker = compiler.new_masker()
    gen = torch.Generator().manual_seed(seeds[0])
    outputs: list[list[int]] = [[] for _ in seeds]
    for _ in range(MAX_STEPS):
        if all(m is None for m in matchers):
            break
        logits = torch.randn(len(matchers), compiler.vocab_size, generator=gen) * 2 + bias
        masker.apply(logits, matchers)
        sampled = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=gen)[:, 0]
        for row, matcher in enumerate(matchers):
            if matcher is None:
                continue
            token = int(sampled[row])
            assert token < len(tokenizer), "a padding id beyond the tokenizer was sampled"
            assert matcher.accept_token(token)
            outputs[row].append(token)
            if matcher.is_terminated():
                assert token == tokenizer.eos_token_id
                matchers[row] = None
    assert all(m is None for m in matchers), f"not terminated in {MAX_STEPS} steps"
    return [tokenizer.decode(ids, skip_special_tokens=True) for ids in outputs]


def test_json_schema_output_satisfies_schema(compiler, tokenizer, closer_bias) -> None:
    spec = grammar_spec_from_sampling_params({"json_schema": json.dumps(SCHEMA)})
    for text in _generate(compiler, tokenizer, closer_bias, spec, range(6)):
        value = json.loads(text)
        assert set(value) == set(SCHEMA["required"])
        assert isinstance(value["name"], str) and len(value["name"]) <= 12
        assert type(value["age"]) is int and 0 <= value["age"] <= 150
        assert value["color"] in ("red", "green", "blue")
        assert isinstance(value["tags"], list) and len(value["tags"]) <= 3
        assert all(isinstance(t, str) and len(t) <= 6 for t in value["tags"])


def test_any_json_yields_valid_json(compiler, tokenizer, closer_bias) -> None:
    spec = grammar_spec_from_sampling_params({"json_schema": ANY_JSON})
    for text in _generate(compiler, tokenizer, closer_bias, spec, range(10, 16)):
        assert isinstance(json.loads(text), dict | list)


def test_regex_output_fullmatches(compiler, tokenizer, closer_bias) -> None:
    spec = grammar_spec_from_sampling_params({"regex": REGEX, "json_schema": None})
    for text in _generate(compiler, tokenizer, closer_bias, spec, range(20, 26)):
        assert re.fullmatch(REGEX, text), text


def test_ebnf_output_matches(compiler, tokenizer, closer_bias) -> None:
    spec = grammar_spec_from_sampling_params({"ebnf": EBNF})
    command = r"(add|sub) [1-9][0-9]{0,2}"
    for text in _generate(compiler, tokenizer, closer_bias, spec, range(30, 36)):
        assert re.fullmatch(rf"{command}(;{command})*", text), text


def test_mixed_batch_leaves_unconstrained_rows_untouched(compiler, tokenizer) -> None:
    matchers = [
        compiler.new_matcher(GrammarSpec("regex", REGEX)),
        None,
        compiler.new_matcher(GrammarSpec("json_schema", ANY_JSON)),
        None,
    ]
    logits = torch.randn(4, compiler.vocab_size, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    compiler.new_masker().apply(logits, matchers)
    assert torch.equal(logits[1], before[1]) and torch.equal(logits[3], before[3])
    for row in (0, 2):
        allowed = torch.isfinite(logits[row])
        assert 0 < int(allowed.sum()) < len(tokenizer)
        assert torch.equal(logits[row][allowed], before[row][allowed])
        assert not allowed[len(tokenizer) :].any()
        assert not allowed[tokenizer.eos_token_id]  # nothing generated yet: cannot stop


def test_complete_grammar_allows_only_stop_tokens(tokenizer, vocab_size) -> None:
    extra_stop = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    compiler = GrammarCompiler(tokenizer, vocab_size, stop_token_ids=[extra_stop])
    assert set(compiler.stop_token_ids) == {tokenizer.eos_token_id, extra_stop}
    matcher = compiler.new_matcher(GrammarSpec("regex", "add 7"))
    masker = compiler.new_masker()
    for token in tokenizer.encode("add 7"):
        assert not matcher.can_stop()
        assert matcher.accept_token(token)
    assert matcher.can_stop() and not matcher.is_terminated()
    logits = torch.zeros(1, vocab_size)
    masker.apply(logits, [matcher])
    assert set(torch.isfinite(logits[0]).nonzero().flatten().tolist()) == {
        tokenizer.eos_token_id,
        extra_stop,
    }
    assert matcher.accept_token(extra_stop) and matcher.is_terminated()
    assert not matcher.accept_token(tokenizer.eos_token_id)  # nothing after termination
    logits = torch.zeros(1, vocab_size)
    masker.apply(logits, [matcher])  # a finished row may still only stop
    assert set(torch.isfinite(logits[0]).nonzero().flatten().tolist()) == {
        tokenizer.eos_token_id,
        extra_stop,
    }


def test_rejected_token_leaves_matcher_usable(compiler, tokenizer, vocab_size) -> None:
    matcher = compiler.new_matcher(GrammarSpec("regex", "add 7"))
    assert not matcher.accept_token(tokenizer.encode("sub")[0])
    assert not matcher.accept_token(vocab_size - 1)  # padding id
    assert not matcher.accept_token(vocab_size + 5)  # beyond the logits
    assert all(matcher.accept_token(t) for t in tokenizer.encode("add 7"))


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"json_schema": '{"type": "object", "properties": '}, "json_schema"),
        ({"json_schema": '{"type": "nonsense"}'}, "json_schema"),
        ({"regex": "a(b"}, "regex"),
        ({"ebnf": "root ::= missing_rule"}, "ebnf"),
        ({"structural_tag": '{"type": "structural_tag", "format": '}, "structural_tag"),
        ({"structural_tag": '{"type": "structural_tag"}'}, "structural_tag"),
        ({"structural_tag": json.dumps(_tag({"type": "nonsense"}))}, "structural_tag"),
    ],
)
def test_bad_grammar_raises_naming_the_param(compiler, params, param) -> None:
    spec = grammar_spec_from_sampling_params(params)
    with pytest.raises(GrammarError, match=rf"^invalid {param}: \S") as info:
        compiler.compile(spec)
    assert info.value.param == param
    assert "/project/" not in str(info.value) and "Check failed" not in str(info.value)


def test_sampling_params_parsing() -> None:
    with pytest.raises(GrammarError, match="json_schema, regex") as info:
        grammar_spec_from_sampling_params({"json_schema": "{}", "regex": "a", "ebnf": None})
    assert info.value.param == "json_schema,regex"
    with pytest.raises(GrammarError, match="regex must be a string"):
        grammar_spec_from_sampling_params({"regex": 5})
    assert grammar_spec_from_sampling_params({"temperature": 1.0, "regex": None}) is None
    spec = grammar_spec_from_sampling_params({"json_schema": {"type": "object", "a": 1}})
    assert spec == GrammarSpec("json_schema", '{"type": "object", "a": 1}')


def test_compile_cache_reuses_and_evicts(tokenizer, vocab_size) -> None:
    compiler = GrammarCompiler(tokenizer, vocab_size, max_cached=2)
    first = compiler.compile(GrammarSpec("regex", "a+"))
    assert compiler.compile(GrammarSpec("regex", "a+")) is first
    assert compiler.compile(GrammarSpec("ebnf", 'root ::= "a"+')) is not first
    compiler.compile(GrammarSpec("regex", "b+"))
    compiler.compile(GrammarSpec("regex", "c+"))
    assert compiler.compile(GrammarSpec("regex", "a+")) is not first  # evicted, recompiled


def test_bounded_json_string_takes_escapes_not_control_chars(compiler, tokenizer) -> None:
    """Guards our rewrite around mlc-ai/xgrammar#800 (length-bounded strings)."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 4}}}
    spec = GrammarSpec("json_schema", json.dumps({**schema, "required": ["s"]}))

    def accepts(text: str) -> bool:
        matcher = compiler.new_matcher(spec)
        return all(matcher.accept_token(t) for t in tokenizer.encode(text)) and matcher.can_stop()

    assert accepts('{"s": "a\\tb"}') and json.loads('{"s": "a\\tb"}') == {"s": "a\tb"}
    assert accepts('{"s": "\\u00e9\\"z"}')
    assert not accepts('{"s": "a\tb"}')  # a raw tab is not JSON
    assert not accepts('{"s": "abcde"}')


def test_structural_tag_writes_json_as_the_compiler_does_then_the_closing_text(
    tokenizer, vocab_size, closer_bias
) -> None:
    """A forced tool call's tag: the JSON takes the engine's whitespace (the standard ``", "`` and
    ``": "`` with ``json_any_whitespace=False``, as a chat template writes it; xgrammar's own
    structural-tag compiler would allow any), then the closing text, then only a stop token."""
    compiler = GrammarCompiler(tokenizer, vocab_size, json_any_whitespace=False)
    spec = grammar_spec_from_sampling_params({"structural_tag": json.dumps(_tag(CALL))})
    assert spec == GrammarSpec("structural_tag", json.dumps(_tag(CALL)))
    for text in _generate(compiler, tokenizer, closer_bias, spec, range(40, 46)):
        assert text.endswith(CLOSING), text
        call = text.removesuffix(CLOSING)
        assert json.dumps(json.loads(call)) == call  # exactly json.dumps's separators
        assert json.loads(call)["name"] == "paint"

    def accepts(text: str) -> bool:
        matcher = compiler.new_matcher(spec)
        return all(matcher.accept_token(t) for t in tokenizer.encode(text)) and matcher.can_stop()

    call = json.dumps({"name": "paint", "arguments": {"color": "red", "age": 3, "tags": []}})
    assert accepts(call + CLOSING)
    assert not accepts(call)  # the closing text is part of the grammar
    assert not accepts(call.replace(", ", ",") + CLOSING)
    assert not accepts(call.replace("{", "{ ", 1) + CLOSING)


def test_structural_tag_shapes_of_xgrammar_alone_compile(compiler, tokenizer, closer_bias) -> None:
    """A tag format with nothing of JSON in it is xgrammar's to compile."""
    tag = {"type": "structural_tag", "format": {"type": "const_string", "value": "add 7"}}
    spec = grammar_spec_from_sampling_params({"structural_tag": tag})
    assert _generate(compiler, tokenizer, closer_bias, spec, range(50, 52)) == ["add 7"] * 2
