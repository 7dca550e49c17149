"""HTTP helpers the gateway tests share: keys in headers, and the data lines of an SSE stream."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx


def bearer(key: str) -> dict[str, str]:
    """The ``Authorization`` header that presents ``key`` (the OpenAI clients' way)."""
    return {"Authorization": f"Bearer {key}"}


def group_metadata(group: object) -> Any:
    """A body's ``metadata`` naming an online conversation's group; typed ``Any`` for the
    anthropic SDK, whose ``MetadataParam`` knows ``user_id`` only."""
    return {"areal_group": group}


def sse_data(resp: httpx.Response) -> Iterator[str]:
    """The payload of each ``data:`` line of a streamed answer, as it arrives."""
    for line in resp.iter_lines():
        if line.startswith("data: "):
            yield line[6:]


def chat_completion(
    url: str, key: str, content: str, model: str = "areal-tiny", max_tokens: int = 4
) -> dict[str, Any]:
    """One short ``/v1/chat/completions`` call with ``key``; it must answer 200."""
    body = {"model": model, "messages": [{"role": "user", "content": content}]}
    resp = httpx.post(
        f"{url}/v1/chat/completions",
        json={**body, "max_tokens": max_tokens},
        headers=bearer(key),
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


def error_of(resp: httpx.Response, status: int) -> dict[str, Any]:
    """The OpenAI-schema error of an answer that must have ``status``."""
    assert resp.status_code == status, resp.text
    err: dict[str, Any] = resp.json()["error"]
    assert isinstance(err["message"], str) and err["type"]
    return err
