"""The embedded engine's streamed ``/generate``: incremental chunks by default (what each step
adds), cumulative ones on request, and a stream's bytes linear in its length."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

from areal.plugins.inference.embedded.streaming import TextChunker

SAMPLED = {"max_new_tokens": 160, "temperature": 1.0, "ignore_eos": True, "sampling_seed": 7}


def stream_raw(url: str, body: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """The chunks of one streamed ``/generate`` as sent, and the bytes of the whole stream."""
    with httpx.stream("POST", f"{url}/generate", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read()
    lines = [line for line in raw.decode().split("\n") if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]], len(raw)


def joined(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """Incremental chunks put back together: ids, log-probs and text concatenated."""
    triples = [t for c in chunks for t in c["meta_info"]["output_token_logprobs"]]
    return {
        "output_ids": [t for c in chunks for t in c["output_ids"]],
        "text": "".join(c["text"] for c in chunks),
        "logprobs": [t[0] for t in triples],
        "logprob_ids": [t[1] for t in triples],
    }


@pytest.mark.parametrize(
    "prompt",
    [{"text": "Once upon a time"}, {"input_ids": [11, 402, 77, 1500, 9, 333]}],
    ids=["text", "ids"],
)
def test_incremental_chunks_join_to_the_plain_answer(server: Any, prompt: dict[str, Any]) -> None:
    """Sampled tokens of an untrained byte-level model split characters across tokens: each
    piece of text must still be final, so the pieces join to exactly the plain answer's text."""
    body = {**prompt, "return_logprob": True, "sampling_params": SAMPLED}
    whole = server.generate(**body)
    chunks, _ = stream_raw(server.url, body)
    assert len(chunks) == SAMPLED["max_new_tokens"]
    assert all(len(c["output_ids"]) <= 1 for c in chunks)  # one token per step, never the lot
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == list(range(1, 161))
    got = joined(chunks)
    assert got["output_ids"] == got["logprob_ids"] == whole["output_ids"]
    expected = [t[0] for t in whole["meta_info"]["output_token_logprobs"]]
    assert got["logprobs"] == pytest.approx(expected, abs=1e-5)
    assert got["text"] == whole["text"]
    assert not any(c["text"].endswith("\ufffd") for c in chunks[:-1])  # no half characters
    assert chunks[-1]["meta_info"]["weight_versions"] == whole["meta_info"]["weight_versions"]
    assert chunks[-1]["meta_info"]["finish_reason"] == whole["meta_info"]["finish_reason"]


def test_incremental_text_never_shows_a_trimmed_stop_string(server: Any) -> None:
    free = server.generate(
        text="The tool",
        sampling_params={"max_new_tokens": 24, "temperature": 0, "ignore_eos": True},
    )
    stop = free["text"].split()[2]
    params = {"max_new_tokens": 24, "temperature": 0, "stop": [stop]}
    whole = server.generate(text="The tool", sampling_params=params)
    chunks, _ = stream_raw(server.url, {"text": "The tool", "sampling_params": params})
    assert whole["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    sent = ""
    for chunk in chunks:
        sent += chunk["text"]
        assert whole["text"].startswith(sent)  # nothing sent is ever taken back
    assert sent == whole["text"] and stop not in sent


def test_prompt_logprobs_ride_on_the_final_chunk(server: Any) -> None:
    body = {
        "input_ids": [4, 5, 6, 7],
        "return_logprob": True,
        "logprob_start_len": 0,
        "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True},
    }
    whole = server.generate(**body)
    chunks, _ = stream_raw(server.url, body)
    assert all("input_token_logprobs" not in c["meta_info"] for c in chunks[:-1])
    final = chunks[-1]["meta_info"]["input_token_logprobs"]
    assert final == whole["meta_info"]["input_token_logprobs"]


def test_stream_bytes_grow_linearly(server: Any) -> None:
    """Twice the tokens, about twice the bytes (a cumulative stream would send four times)."""

    def size(n: int) -> int:
        params = {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}
        body = {"input_ids": [4, 5, 6], "return_logprob": True, "sampling_params": params}
        return stream_raw(server.url, body)[1]

    small, large = size(150), size(300)
    assert large / small < 2.5, (small, large)


def test_cumulative_streaming_output_for_compatibility(
    start_server: Callable[..., AbstractContextManager[Any]],
) -> None:
    """``--cumulative-streaming-output``: every chunk the whole output so far, as SGLang's default;
    the same answer, at quadratic cost."""
    body = {"input_ids": [4, 5, 6], "return_logprob": True}
    with start_server(incremental_streaming_output=False) as srv:
        chunks, small = stream_raw(
            srv.url, {**body, "sampling_params": {**SAMPLED, "max_new_tokens": 80}}
        )
        _, large = stream_raw(srv.url, {**body, "sampling_params": SAMPLED})
        whole = srv.generate(**body, sampling_params={**SAMPLED, "max_new_tokens": 80})
    assert [len(c["output_ids"]) for c in chunks] == list(range(1, 81))
    assert chunks[-1]["output_ids"] == whole["output_ids"]
    assert chunks[-1]["text"] == whole["text"]
    assert large / small > 3, (small, large)


def test_text_chunker_pieces_join_to_the_decoded_text(nano_model_dir: str) -> None:
    """Token by token over characters of one to four bytes, split into single bytes."""
    tokenizer = AutoTokenizer.from_pretrained(nano_model_dir)
    byte_token = {b: tokenizer.convert_tokens_to_ids(c) for b, c in byte_level_chars().items()}
    text = "héllo wörld — 你好, 🎉 done! ünïcödé ✓"
    split = [byte_token[b] for b in "你🎉".encode()]  # a character over several tokens
    stray = [byte_token[0xE4], byte_token[0x80]]  # bytes that never make a character
    prompt = [1, 2]
    full = [*prompt, *stray, *tokenizer.encode(text), *split, *split[:2]]
    chunker = TextChunker(lambda x: tokenizer.decode(x), ["done!"])
    pieces = [chunker.step(full[: k + 1], len(prompt)) for k in range(len(prompt), len(full))]
    final = tokenizer.decode(full[len(prompt) :])
    pieces.append(chunker.finish(final, "rid"))
    assert "".join(pieces) == final and "你🎉" in final
    assert pieces.count("") >= 5  # held back while characters were incomplete
    assert not any(p.endswith("\ufffd") for p in pieces[:-1] if p)


def byte_level_chars() -> dict[int, str]:
    """The printable character a byte-level BPE vocabulary (GPT-2's scheme) writes for each
    byte: printable Latin-1 bytes stand for themselves, the others take code points from 256."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    others = [b for b in range(256) if b not in chars]
    chars.update({b: chr(256 + i) for i, b in enumerate(others)})
    return chars
