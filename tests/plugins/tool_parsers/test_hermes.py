"""The Qwen/Hermes tool-call parser: whole texts, streams cut anywhere, and what stays content."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from areal.core.tool_calls import StreamEvent
from areal.plugins.tool_parsers.hermes import CLOSE, OPEN, HermesParser, parse_call

CALL_A = '{"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}'
CALL_B = '{"name": "now", "arguments": {}}'


def streamed(text: str, cuts: list[int]) -> list[StreamEvent]:
    stream = HermesParser().new_stream()
    events: list[StreamEvent] = []
    last = 0
    for cut in sorted(set(cuts)):
        events += stream.feed(text[last:cut])
        last = cut
    events += stream.feed(text[last:])
    return events + stream.finish()


def summary(events: list[StreamEvent]) -> tuple[str, list[tuple[str, str]]]:
    text = "".join(e.text for e in events if e.kind == "text")
    calls = [(e.call.name, e.call.arguments) for e in events if e.call is not None]
    return text, calls


def test_qwen_layout_with_text_around() -> None:
    text = f"Let me look.\n{OPEN}\n{CALL_A}\n{CLOSE}\n{OPEN}\n{CALL_B}\n{CLOSE}"
    parsed = HermesParser().parse(text)
    assert parsed.content == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [
        ("get_weather", {"city": "Zürich", "days": 2}),
        ("now", {}),
    ]
    assert parsed.tool_calls[0].id != parsed.tool_calls[1].id
    assert parsed.tool_calls[0].id.startswith("call_")


def test_text_without_calls_is_returned_unchanged() -> None:
    for text in ("", "  plain  ", "a < b and <tool", f"{OPEN} not json {CLOSE} tail", CLOSE):
        parsed = HermesParser().parse(text)
        assert parsed.content == text and parsed.tool_calls == []


def test_unclosed_and_unterminated_calls() -> None:
    parser = HermesParser()
    # the output ended (max tokens or EOS) right after the JSON
    assert [c.name for c in parser.parse(f"{OPEN}\n{CALL_A}").tool_calls] == ["get_weather"]
    # a call the model forgot to close still counts; the next one is not swallowed
    parsed = parser.parse(f"{OPEN}{CALL_A}\n{OPEN}{CALL_B}{CLOSE}")
    assert [c.name for c in parsed.tool_calls] == ["get_weather", "now"]
    # a broken call stays text, and does not hide the valid call after it
    parsed = parser.parse(f"x{OPEN}{{broken{OPEN}{CALL_B}{CLOSE}")
    assert parsed.content == f"x{OPEN}{{broken"
    assert [c.name for c in parsed.tool_calls] == ["now"]
    # a call cut off inside its JSON stays text
    cut = f"{OPEN}\n{CALL_A[:20]}"
    assert parser.parse(cut).content == cut and not parser.parse(cut).tool_calls


def test_parse_call_accepts_the_variants_models_write() -> None:
    call = parse_call('{"name": "f", "arguments": "{\\"x\\": 1}"}')  # arguments as a JSON string
    assert call is not None and json.loads(call.arguments) == {"x": 1}
    call = parse_call('{"name": "f", "parameters": {"x": 1}}')  # the Llama-style key
    assert call is not None and json.loads(call.arguments) == {"x": 1}
    call = parse_call('{"name": "f", "arguments": null}')  # a function without arguments
    assert call is not None and call.arguments == "{}"
    call = parse_call('{"name": "f"}')
    assert call is not None and call.arguments == "{}"
    call = parse_call('{"name": "f", "arguments": {"s": "日本"}}')
    assert call is not None and call.arguments == '{"s": "日本"}'  # not \\u-escaped
    for bad in ('{"arguments": {}}', '{"name": 3}', '{"name": "f", "arguments": [1]}', "[]", "{"):
        assert parse_call(bad) is None, bad


def test_stream_releases_text_early_and_holds_possible_tags() -> None:
    stream = HermesParser().new_stream()
    assert summary(stream.feed("Hello <to")) == ("Hello ", [])  # "<to" may open a call
    assert summary(stream.feed("day")) == ("<today", [])  # it did not
    assert summary(stream.feed(f" {OPEN}\n{CALL_B}")) == (" ", [])  # inside a call: wait
    assert summary(stream.feed(f"\n{CLOSE}")) == ("", [("now", "{}")])
    assert summary(stream.feed("bye")) == ("bye", [])
    assert stream.finish() == []


def test_forced_prefix_opens_a_call() -> None:
    parser = HermesParser()
    prefix = parser.forced_prefix()
    assert prefix.startswith(OPEN)
    stream = parser.new_stream()
    assert stream.feed(prefix) == []
    stream.feed(CALL_A)
    assert summary(stream.finish()) == ("", [("get_weather", '{"city": "Zürich", "days": 2}')])


def test_forced_suffix_closes_the_call() -> None:
    """A forced call is generated as prefix (in the prompt) + JSON + suffix, the layout the chat
    template renders a call in; the parser reads it whole, streamed or not."""
    parser = HermesParser()
    text = parser.forced_prefix() + CALL_A + parser.forced_suffix()
    assert text == f"{OPEN}\n{CALL_A}\n{CLOSE}"
    parsed = parser.parse(text)
    assert (parsed.content, [(c.name, c.arguments) for c in parsed.tool_calls]) == (
        "",
        [("get_weather", '{"city": "Zürich", "days": 2}')],
    )
    stream = parser.new_stream()
    assert stream.feed(parser.forced_prefix() + CALL_A) == []
    assert summary(stream.feed(parser.forced_suffix())) == (
        "",
        [("get_weather", parsed.tool_calls[0].arguments)],
    )
    assert stream.finish() == []


PIECES = st.sampled_from(
    [OPEN, CLOSE, CALL_A, CALL_B, "\n", " ", "<tool", "</tool_c", "{", "}", '"name"', "ok", "é"]
)


@settings(max_examples=300, deadline=None)
@given(
    pieces=st.lists(st.one_of(PIECES, st.text(max_size=4)), max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12),
)
def test_streams_cut_anywhere_agree_with_whole_parsing(pieces: list[str], cuts: list[int]) -> None:
    text = "".join(pieces)
    text_out, calls = summary(streamed(text, [c for c in cuts if c <= len(text)]))
    parsed = HermesParser().parse(text)
    assert calls == [(c.name, c.arguments) for c in parsed.tool_calls]
    if calls:
        assert text_out.strip() == parsed.content
    else:
        assert text_out == text == parsed.content  # nothing the model wrote is lost
