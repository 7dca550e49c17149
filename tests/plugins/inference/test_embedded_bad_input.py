"""Bad input gets a 4xx in SGLang's error shape with a clear message; the server keeps serving."""

from __future__ import annotations

from typing import Any

import pytest

CASES: list[tuple[str, Any, str]] = [
    ("unknown field", {"input_ids": [1, 2], "temperature": 0.5}, "temperature: unknown field"),
    (
        "unknown sampling field",
        {"input_ids": [1], "sampling_params": {"max_tokens": 5}},
        "max_tokens: unknown field",
    ),
    (
        "wrong type",
        {"input_ids": [1], "sampling_params": {"max_new_tokens": "ten"}},
        "max_new_tokens",
    ),
    ("ids not ints", {"input_ids": ["a", "b"]}, "input_ids must be a list of token ids"),
    ("empty prompt ids", {"input_ids": []}, "the prompt is empty"),
    ("empty prompt text", {"text": ""}, "the prompt is empty"),
    ("no prompt", {"sampling_params": {}}, "exactly one of 'text' or 'input_ids'"),
    ("both prompts", {"text": "a", "input_ids": [1]}, "exactly one of 'text' or 'input_ids'"),
    (
        "zero new tokens",
        {"input_ids": [1], "sampling_params": {"max_new_tokens": 0}},
        "max_new_tokens: must be a positive",
    ),
    (
        "negative new tokens",
        {"input_ids": [1], "sampling_params": {"max_new_tokens": -3}},
        "must be a positive",
    ),
    ("token outside vocab", {"input_ids": [1, 999999]}, "outside the vocabulary"),
    (
        "too long prompt",
        {"input_ids": [1] * 5000, "sampling_params": {"max_new_tokens": 8}},
        "exceeds the model's context of 4096",
    ),
    ("bad temperature", {"input_ids": [1], "sampling_params": {"temperature": -1}}, "temperature"),
    ("bad top_p", {"input_ids": [1], "sampling_params": {"top_p": 0}}, "top_p"),
    ("bad top_k", {"input_ids": [1], "sampling_params": {"top_k": 0}}, "top_k"),
    (
        "unsupported penalty",
        {"input_ids": [1], "sampling_params": {"repetition_penalty": 1.2}},
        "repetition_penalty not supported",
    ),
    ("unsupported lora", {"input_ids": [1], "lora_path": "x"}, "lora_path not supported"),
    (
        "bad json schema",
        {"input_ids": [1], "sampling_params": {"json_schema": "{not json"}},
        "json_schema",
    ),
    ("bad regex", {"input_ids": [1], "sampling_params": {"regex": "(unclosed"}}, "regex"),
    (
        "two grammars",
        {"input_ids": [1], "sampling_params": {"regex": "a", "ebnf": 'root ::= "a"'}},
        "regex",
    ),
    (
        "batch size mismatch",
        {"input_ids": [[1], [2]], "sampling_params": [{}, {}, {}]},
        "3 entries for a batch of 2",
    ),
]


@pytest.mark.parametrize(("name", "body", "needle"), CASES, ids=[c[0] for c in CASES])
def test_bad_generate_requests(server: Any, name: str, body: Any, needle: str) -> None:
    resp = server.http.post("/generate", json=body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 400
    assert needle in error["message"]


def test_malformed_bodies(server: Any) -> None:
    for raw in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        resp = server.http.post(
            "/generate", content=raw, headers={"content-type": "application/json"}
        )
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["message"]


def test_control_endpoints_validate(server: Any) -> None:
    assert server.http.post("/pause_generation", json={"mode": "sideways"}).status_code == 400
    assert server.http.post("/abort_request", json={}).status_code == 400
    assert server.http.post("/update_weights_from_disk", json={}).status_code == 400
    assert server.http.get("/generate").status_code == 405
    missing = server.http.get("/no_such_route")
    assert missing.status_code == 404 and "no_such_route" in missing.json()["error"]["message"]


def test_server_survives_bad_input(server: Any) -> None:
    for body, _, _ in [(c[1], None, None) for c in CASES]:
        server.http.post("/generate", json=body)
    assert server.http.get("/health").status_code == 200
    out = server.generate(
        input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 3, "ignore_eos": True}
    )
    assert len(out["output_ids"]) == 3
