"""Continuous batching: concurrent requests share steps, finished ones leave at once, the KV budget
bounds memory and makes the rest wait rather than grow."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from support.engines import wait_decoding


def _greedy(url: str, prompt: list[int], n: int) -> dict[str, Any]:
    body = {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True},
        "return_logprob": True,
    }
    resp = httpx.post(f"{url}/generate", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_concurrent_requests_equal_solo_runs(start_server: Any) -> None:
    """Each of 12 concurrent sequences (different lengths) gets exactly what it gets alone."""
    prompts = [[(7 * i + j) % 4000 + 9 for j in range(3 + 5 * i)] for i in range(12)]
    lengths = [8 + 3 * i for i in range(12)]
    with start_server() as srv:
        solo = [_greedy(srv.url, p, n) for p, n in zip(prompts, lengths)]
        srv.server.engine.peak_running = 0
        with ThreadPoolExecutor(12) as pool:
            together = list(pool.map(lambda a: _greedy(srv.url, *a), zip(prompts, lengths)))
        peak = srv.server.engine.peak_running
    assert peak >= 6, f"requests did not share decode steps (peak batch {peak})"
    for alone, shared in zip(solo, together):
        assert shared["output_ids"] == alone["output_ids"]
        a = [t[0] for t in alone["meta_info"]["output_token_logprobs"]]
        b = [t[0] for t in shared["meta_info"]["output_token_logprobs"]]
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4


def test_finished_sequence_leaves_at_once(server: Any) -> None:
    """A short request that joins a long one's batch answers while the long one still decodes:
    a finished sequence leaves the batch at its last token, not when the batch ends."""
    long_body = {
        "input_ids": [5, 6, 7],
        "sampling_params": {"max_new_tokens": 4000, "temperature": 0.0, "ignore_eos": True},
        "rid": "long",
    }
    with ThreadPoolExecutor(1) as pool:
        long = pool.submit(httpx.post, f"{server.url}/generate", json=long_body, timeout=120)
        wait_decoding(server.stats)
        short = _greedy(server.url, [8, 9], 2)
        assert server.stats()["running"] == 1 and not long.done(), "the long one ended first"
        assert server.http.post("/abort_request", json={"rid": "long"}).status_code == 200
        cut = long.result(timeout=60).json()
    assert len(short["output_ids"]) == 2
    assert cut["meta_info"]["finish_reason"]["type"] == "abort"
    assert 0 < len(cut["output_ids"]) < 4000


def test_kv_budget_queues_instead_of_growing(start_server: Any) -> None:
    """A 64-token budget holds one 40-token request at a time: the others wait, all complete."""
    with start_server(max_total_tokens=64) as srv:
        engine = srv.server.engine
        pool_bytes = engine.pool.nbytes()
        engine.peak_running = 0
        with ThreadPoolExecutor(4) as pool:
            outs = list(pool.map(lambda i: _greedy(srv.url, [10 + i] * 8, 32), range(4)))
        assert engine.peak_running == 1
        assert all(len(o["output_ids"]) == 32 for o in outs)
        stats = srv.http.get("/server_info").json()
        assert stats["kv_used_tokens"] == 0 and stats["running"] == 0
        assert 40 <= stats["kv_peak_used_tokens"] <= 64  # one request's 40 at a time, in budget
        # the default: packed or not, as this CPU measured at start-up (packed_linear.py)
        weights = stats["linear_weights"]
        assert weights["chosen_by"] == "measured"
        assert weights["packed"] == (weights["packed_ms"] < weights["plain_ms"])
        assert weights["packed"] == (engine._prepacked is not None)
        assert engine.pool.nbytes() == pool_bytes
        too_big = srv.http.post(
            "/generate", json={"input_ids": [1] * 40, "sampling_params": {"max_new_tokens": 30}}
        )
    assert too_big.status_code == 400
    assert "KV cache budget of 64 tokens" in too_big.json()["error"]["message"]


@pytest.mark.parametrize("n", [1, 3])
def test_batch_and_n_return_lists(server: Any, n: int) -> None:
    out = server.generate(
        input_ids=[[5, 6, 7], [9, 10]],
        sampling_params={"max_new_tokens": 5, "n": n, "ignore_eos": True},
        rid=["a", "b"],
    )
    assert isinstance(out, list) and len(out) == 2 * n
    ids = sorted(o["meta_info"]["id"] for o in out)
    assert ids == (["a", "b"] if n == 1 else sorted(f"{r}-{j}" for r in "ab" for j in range(n)))
    assert all(o["meta_info"]["completion_tokens"] == 5 for o in out)
