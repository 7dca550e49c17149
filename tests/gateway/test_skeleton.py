"""The gateway's frame: keys, prefixes, errors in each protocol's schema, the access log."""

from __future__ import annotations

from typing import Any

import httpx


def test_models_under_every_prefix(gateway: Any) -> None:
    for prefix in ("/v1", "/gateway/v1", ""):
        resp = httpx.get(f"{gateway.url}{prefix}/models", headers=gateway.headers())
        assert resp.status_code == 200, resp.text
        assert resp.json()["data"][0]["id"] == gateway.model


def test_keys_are_required_and_errors_follow_the_protocol(gateway: Any) -> None:
    openai = httpx.post(f"{gateway.v1}/chat/completions", json={})
    assert openai.status_code == 401 and openai.json()["error"]["code"] == "invalid_api_key"
    anthropic = httpx.post(
        f"{gateway.v1}/messages?beta=true", json={}, headers={"x-api-key": "wrong"}
    )
    assert anthropic.status_code == 401
    assert (
        anthropic.json()["type"] == "error"
        and anthropic.json()["error"]["type"] == "authentication_error"
    )
    assert httpx.get(f"{gateway.url}/health").status_code == 200


def test_access_log_has_no_secrets(gateway: Any) -> None:
    httpx.get(f"{gateway.v1}/models", headers=gateway.headers())
    httpx.get(f"{gateway.v1}/models", headers=gateway.headers("sk-not-the-key-123456"))
    text = (gateway.log_dir / "gateway.log").read_text()
    assert "path=/v1/models" in text and "status=401" in text and "status=200" in text
    assert gateway.key not in text and "sk-not-the-key" not in text


def test_policy_knows_the_engine(gateway: Any) -> None:
    policy = gateway.state.policy
    assert policy.context_length == 4096 and policy.tokenizer is not None
    ids = policy.render([{"role": "user", "content": "hi"}])
    assert ids[0] == 1  # <|im_start|>
