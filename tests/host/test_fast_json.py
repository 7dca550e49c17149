"""The hot-path JSON (orjson) against the standard library's, on what engines and clients send."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from areal.host import fast_json

ENGINE_CHUNKS = [
    '{"text": "a", "output_ids": [17], "meta_info": {"id": "x", "finish_reason": null, '
    '"completion_tokens": 1, "output_token_logprobs": [[-1.25, 17, null]]}}',
    '{"text": "\\u00e9\\ud83d\\ude00", "meta_info": {"weight_version": "3"}}',
    '{"big": 1e308, "small": 5e-324, "neg": -0.0, "int": 9007199254740993}',
]


@pytest.mark.parametrize("chunk", ENGINE_CHUNKS)
def test_an_engine_chunk_reads_as_json_reads_it(chunk: str) -> None:
    assert fast_json.loads_engine(chunk) == json.loads(chunk)
    assert fast_json.loads_engine(chunk.encode()) == json.loads(chunk)


def test_python_engines_non_finite_numbers_still_read() -> None:
    """A Python engine's json.dumps writes NaN and -Infinity (orjson alone refuses them)."""
    value = fast_json.loads_engine('{"top": [[-Infinity, 3, null]], "x": NaN, "y": Infinity}')
    assert value["top"][0][0] == -math.inf and math.isnan(value["x"]) and value["y"] == math.inf


def test_what_is_not_json_even_for_python_is_an_error() -> None:
    with pytest.raises(json.JSONDecodeError):
        fast_json.loads_engine('{"text": "a"')


def test_events_read_back_as_what_was_written() -> None:
    event = {
        "id": "chatcmpl-1",
        "choices": [{"index": 0, "delta": {"content": 'é \n "q" \u2028'}, "logprobs": None}],
        "usage": {"prompt_tokens": 3},
        "f": -1.2345678901234567,
    }
    written = fast_json.dumps(event)
    assert json.loads(written) == event
    assert "é" in written  # UTF-8 as itself, as json.dumps(ensure_ascii=False) wrote it
    assert fast_json.dumps_bytes(event) == written.encode()


def test_values_json_wrote_are_still_written() -> None:
    """Numpy scalars as their Python values, integer keys as strings; a non-finite number as
    null, where json wrote NaN, which no JSON parser but Python's reads."""
    value = {1: np.float64(0.5), "f32": np.float32(0.25), "i": np.int64(7), "nan": math.nan}
    assert json.loads(fast_json.dumps(value)) == {"1": 0.5, "f32": 0.25, "i": 7, "nan": None}
    with pytest.raises(TypeError, match="not JSON serializable"):
        fast_json.dumps({"x": object()})
