"""Sampling features through the HTTP API: stops, seeds, streaming, constrained decoding, text."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from support.engines import wait_decoding


def test_stop_token_ids_end_generation_and_stay_in_output(server: Any) -> None:
    free = server.generate(
        input_ids=[4, 5, 6],
        sampling_params={"max_new_tokens": 20, "temperature": 0, "ignore_eos": True},
    )
    stop_at = free["output_ids"][5]
    first = free["output_ids"].index(stop_at)
    out = server.generate(
        input_ids=[4, 5, 6],
        sampling_params={"max_new_tokens": 20, "temperature": 0, "stop_token_ids": [stop_at]},
    )
    assert out["output_ids"] == free["output_ids"][: first + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_at}


def test_stop_strings_trim_text(server: Any) -> None:
    free = server.generate(
        text="The tool",
        sampling_params={"max_new_tokens": 24, "temperature": 0, "ignore_eos": True},
    )
    words = free["text"].split()
    assert len(words) >= 3, free["text"]
    stop = words[2]
    out = server.generate(
        text="The tool", sampling_params={"max_new_tokens": 24, "temperature": 0, "stop": [stop]}
    )
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["text"] == free["text"][: free["text"].index(stop)]
    kept = server.generate(
        text="The tool",
        sampling_params={
            "max_new_tokens": 24,
            "temperature": 0,
            "stop": stop,
            "no_stop_trim": True,
        },
    )
    assert kept["text"].endswith(stop)


def test_eos_stops_unless_ignored(server: Any) -> None:
    eos = 2  # <|im_end|> in the embedded tokenizer
    out = server.generate(
        input_ids=[1, 9],
        sampling_params={
            "max_new_tokens": 30,
            "temperature": 0,
            "stop_token_ids": [eos],
            "min_new_tokens": 4,
        },
    )
    assert len(out["output_ids"]) >= 4
    assert eos not in out["output_ids"][:3]


def test_seed_reproduces_tokens_whatever_shares_the_batch(server: Any) -> None:
    body = {
        "input_ids": [8, 8, 8],
        "sampling_params": {"max_new_tokens": 20, "sampling_seed": 1234, "ignore_eos": True},
    }
    alone = server.generate(**body)["output_ids"]
    noise = {"input_ids": [3], "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}}
    with ThreadPoolExecutor(4) as pool:
        futures = [
            pool.submit(httpx.post, f"{server.url}/generate", json=b, timeout=60)
            for b in (noise, body, noise, body)
        ]
        results = [f.result().json() for f in futures]
    assert results[1]["output_ids"] == alone and results[3]["output_ids"] == alone
    other = server.generate(
        **{**body, "sampling_params": {**body["sampling_params"], "sampling_seed": 99}}
    )
    assert other["output_ids"] != alone


def test_stream_chunks_are_incremental_and_end_with_done(server: Any) -> None:
    body = {
        "text": "hello",
        "stream": True,
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": 6, "ignore_eos": True},
    }
    chunks = []
    with httpx.stream("POST", f"{server.url}/generate", json=body, timeout=60) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in resp.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert [len(c["output_ids"]) for c in chunks] == [1] * 6  # what each step added
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == [1, 2, 3, 4, 5, 6]
    for chunk in chunks:
        assert [t[1] for t in chunk["meta_info"]["output_token_logprobs"]] == chunk["output_ids"]
    assert [c["meta_info"]["finish_reason"] for c in chunks[:-1]] == [None] * 5
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 6}


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "enum": ["search", "calculator"]},
        "arguments": {
            "type": "object",
            "properties": {"x": {"type": "integer"}},
            "required": ["x"],
        },
    },
    "required": ["name", "arguments"],
}


def test_json_schema_constrains_an_untrained_model(server: Any) -> None:
    for seed in range(3):
        out = server.generate(
            text="Call a tool:",
            sampling_params={
                "max_new_tokens": 200,
                "json_schema": json.dumps(SCHEMA),
                "sampling_seed": seed,
            },
        )
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        value = json.loads(out["text"])
        assert value["name"] in ("search", "calculator") and isinstance(
            value["arguments"]["x"], int
        )


def test_regex_and_ebnf(server: Any) -> None:
    out = server.generate(
        text="Date:",
        sampling_params={"max_new_tokens": 40, "regex": r"20[0-9]{2}-[01][0-9]-[0-3][0-9]"},
    )
    assert re.fullmatch(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]", out["text"]), out["text"]
    ebnf = 'root ::= "yes" | "no"'
    out = server.generate(text="Answer:", sampling_params={"max_new_tokens": 10, "ebnf": ebnf})
    assert out["text"] in ("yes", "no")


def test_text_prompt_equals_its_token_ids(server: Any) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(server.server.model_path)
    greedy = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    by_text = server.generate(text="Hello there", sampling_params=greedy)
    by_ids = server.generate(input_ids=tok.encode("Hello there"), sampling_params=greedy)
    assert by_text["output_ids"] == by_ids["output_ids"]
    assert by_text["text"] == tok.decode(by_text["output_ids"], skip_special_tokens=True)
    assert by_text["meta_info"]["prompt_tokens"] == len(tok.encode("Hello there"))


def test_model_info_and_health(server: Any) -> None:
    info = server.http.get("/model_info").json()
    assert info["model_type"] == "qwen3" and info["architectures"] == ["Qwen3ForCausalLM"]
    assert info["weight_version"] == "0" and info["is_generation"] is True
    assert server.http.get("/get_model_info").json() == info
    assert server.http.get("/health").status_code == 200


def test_text_in_logprobs(server: Any) -> None:
    out = server.generate(
        text="Hi",
        sampling_params={"max_new_tokens": 5, "ignore_eos": True},
        return_logprob=True,
        return_text_in_logprobs=True,
    )
    pieces = [t[2] for t in out["meta_info"]["output_token_logprobs"]]
    assert all(isinstance(p, str) for p in pieces)
    assert "".join(pieces) == out["text"]


def test_request_stop_ids_end_a_completed_grammar(server: Any) -> None:
    """Once the grammar is complete, a request's own stop token may end it (not only EOS)."""
    stop = 5  # <tool_response>: not a stop token of the server
    matched = set()
    for seed in range(12):
        out = server.generate(
            text="Answer:",
            sampling_params={
                "max_new_tokens": 20,
                "regex": "(yes|no)",
                "stop_token_ids": [stop],
                "sampling_seed": seed,
            },
        )
        assert out["meta_info"]["finish_reason"]["type"] == "stop"
        matched.add(out["meta_info"]["finish_reason"]["matched"])
    assert stop in matched and matched <= {stop, 2}


def test_n_samples_abort_by_the_client_rid(start_server: Any) -> None:
    long = {"max_new_tokens": 3000, "ignore_eos": True}
    with start_server() as srv, ThreadPoolExecutor(1) as pool:
        fut = pool.submit(
            httpx.post,
            f"{srv.url}/generate",
            json={"input_ids": [5], "sampling_params": {**long, "n": 2}, "rid": "job"},
            timeout=60,
        )
        wait_decoding(srv.stats, 2)
        assert srv.http.post("/abort_request", json={"rid": "job"}).status_code == 200
        outs = fut.result(timeout=30).json()
    assert sorted(o["meta_info"]["id"] for o in outs) == ["job-0", "job-1"]
    assert all(o["meta_info"]["finish_reason"]["type"] == "abort" for o in outs)


def test_one_rid_for_a_batch_is_refused(server: Any) -> None:
    resp = server.http.post("/generate", json={"input_ids": [[1], [2]], "rid": "same"})
    assert resp.status_code == 400 and "one rid per prompt" in resp.json()["error"]["message"]
