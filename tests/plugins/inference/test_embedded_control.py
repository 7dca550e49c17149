"""Weight updates, pause/continue and aborts on a real server."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from support import eventually
from support.engines import DECODE_S, bare_request, queued, wait_decoding

LONG = {"max_new_tokens": 3000, "temperature": 1.0, "ignore_eos": True}


def _post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=120)


def test_update_weights_from_disk(
    perturbed: Any, start_server: Any, nano_model_dir: str, tmp_path: Path
) -> None:
    new_model = perturbed(nano_model_dir, tmp_path / "v1")
    prompt = [3, 14, 15, 92, 65]
    greedy = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}
    with start_server() as srv:
        before = srv.generate(input_ids=prompt, sampling_params=greedy)
        assert before["meta_info"]["weight_version"] == "0"
        resp = srv.http.post("/update_weights_from_disk", json={"model_path": str(tmp_path / "v1")})
        assert resp.status_code == 200 and resp.json()["success"] is True
        after = srv.generate(input_ids=prompt, sampling_params=greedy, return_logprob=True)
        assert after["meta_info"]["weight_version"] == "1"
        assert srv.http.get("/model_info").json()["weight_version"] == "1"
        named = srv.http.post(
            "/update_weights_from_disk",
            json={"model_path": str(tmp_path / "v1"), "weight_version": "v7"},
        )
        assert (
            named.json()["success"] and srv.http.get("/model_info").json()["weight_version"] == "v7"
        )
        bad = srv.http.post(
            "/update_weights_from_disk", json={"model_path": str(tmp_path / "nope")}
        )
        assert bad.status_code == 400 and bad.json()["success"] is False
        assert "not a directory" in bad.json()["message"]
    with torch.no_grad():
        logits = new_model(torch.tensor([prompt + after["output_ids"]]))[0, len(prompt) - 1 : -1]
    assert after["output_ids"] == logits.argmax(-1).tolist()
    assert after["output_ids"] != before["output_ids"]


def test_mismatched_checkpoint_is_refused(start_server: Any, tmp_path: Path) -> None:
    from areal.plugins.models.tiny import init_tiny

    init_tiny(tmp_path / "tiny", size="tiny")
    with start_server() as srv:
        resp = srv.http.post(
            "/update_weights_from_disk", json={"model_path": str(tmp_path / "tiny")}
        )
        assert resp.status_code == 400 and not resp.json()["success"]
        assert srv.http.get("/model_info").json()["weight_version"] == "0"
        assert srv.generate(input_ids=[1, 2], sampling_params={"max_new_tokens": 2})["output_ids"]


def test_pause_abort_returns_partial_output_and_new_requests_wait(start_server: Any) -> None:
    with start_server() as srv, ThreadPoolExecutor(2) as pool:
        running = pool.submit(
            _post,
            srv.url,
            "/generate",
            {"input_ids": [5, 6], "sampling_params": LONG, "return_logprob": True},
        )
        wait_decoding(srv.stats)
        assert _post(srv.url, "/pause_generation", {"mode": "abort"}).json()["status"] == "ok"
        out = running.result(timeout=30).json()
        finish = out["meta_info"]["finish_reason"]
        assert finish["type"] == "abort"
        assert 0 < len(out["output_ids"]) < 3000
        assert len(out["meta_info"]["output_token_logprobs"]) == len(out["output_ids"])
        waiting: Future[httpx.Response] = pool.submit(
            _post,
            srv.url,
            "/generate",
            {"input_ids": [7], "sampling_params": {"max_new_tokens": 3}},
        )
        eventually(lambda: queued(srv.stats()), DECODE_S, "the request queued at the paused engine")
        # a later turn of the engine's loop still holds it
        assert queued(srv.stats()) and not waiting.done(), "a request was served while paused"
        _post(srv.url, "/continue_generation", {})
        assert waiting.result(timeout=30).json()["meta_info"]["completion_tokens"] == 3


def test_retract_resumes_with_partial_output_and_records_versions(
    perturbed: Any, start_server: Any, nano_model_dir: str, tmp_path: Path
) -> None:
    """Pause (retract), load new weights, continue: the sequence finishes on the new version and
    its per-token versions say which tokens each version produced."""
    perturbed(nano_model_dir, tmp_path / "v1")
    body = {
        "input_ids": [5, 6],
        "sampling_params": {**LONG, "max_new_tokens": 400},
        "return_logprob": True,
    }
    with start_server() as srv, ThreadPoolExecutor(1) as pool:
        running = pool.submit(_post, srv.url, "/generate", body)
        wait_decoding(srv.stats)
        _post(srv.url, "/pause_generation", {"mode": "retract"})
        assert srv.server.engine.stats()["kv_used_tokens"] == 0
        _post(
            srv.url,
            "/update_weights_from_disk",
            {"model_path": str(tmp_path / "v1"), "weight_version": "1"},
        )
        _post(srv.url, "/continue_generation", {})
        out = running.result(timeout=60).json()
    meta = out["meta_info"]
    assert meta["finish_reason"]["type"] == "length" and len(out["output_ids"]) == 400
    spans = meta["weight_versions"]
    assert [s["version"] for s in spans] == ["0", "1"]
    assert (
        spans[0]["start"] == 0 and spans[0]["end"] == spans[1]["start"] and spans[1]["end"] == 400
    )


def test_abort_request_by_rid_and_all(start_server: Any) -> None:
    with start_server() as srv, ThreadPoolExecutor(3) as pool:
        a = pool.submit(
            _post, srv.url, "/generate", {"input_ids": [5], "sampling_params": LONG, "rid": "a"}
        )
        b = pool.submit(
            _post, srv.url, "/generate", {"input_ids": [6], "sampling_params": LONG, "rid": "b"}
        )
        wait_decoding(srv.stats, 2)
        assert _post(srv.url, "/abort_request", {"rid": "a"}).status_code == 200
        out_a = a.result(timeout=30).json()
        assert out_a["meta_info"]["finish_reason"]["type"] == "abort" and not b.done()
        assert srv.http.post("/flush_cache").status_code == 400  # b still runs
        _post(srv.url, "/abort_request", {"abort_all": True})
        assert b.result(timeout=30).json()["meta_info"]["finish_reason"]["type"] == "abort"
        assert srv.http.post("/flush_cache").status_code == 200


def test_update_weights_mid_generation_records_both_versions(
    perturbed: Any, start_server: Any, nano_model_dir: str, tmp_path: Path
) -> None:
    """Without a pause, running sequences continue on the new weights (SGLang's in-place update)."""
    perturbed(nano_model_dir, tmp_path / "v1")
    body = {"input_ids": [9], "sampling_params": {**LONG, "max_new_tokens": 500}}
    with start_server() as srv, ThreadPoolExecutor(1) as pool:
        running = pool.submit(_post, srv.url, "/generate", body)
        wait_decoding(srv.stats)
        _post(srv.url, "/update_weights_from_disk", {"model_path": str(tmp_path / "v1")})
        out = running.result(timeout=60).json()
    assert [s["version"] for s in out["meta_info"]["weight_versions"]] == ["0", "1"]
    assert out["meta_info"]["weight_version"] == "1"


def test_retract_keeps_prompt_logprobs_of_the_prompt(start_server: Any) -> None:
    body = {
        "input_ids": [5, 6, 7],
        "sampling_params": {**LONG, "max_new_tokens": 300},
        "return_logprob": True,
        "logprob_start_len": 0,
    }
    with start_server() as srv, ThreadPoolExecutor(1) as pool:
        running = pool.submit(_post, srv.url, "/generate", body)
        wait_decoding(srv.stats)
        _post(srv.url, "/pause_generation", {"mode": "retract"})
        _post(srv.url, "/continue_generation", {})
        out = running.result(timeout=60).json()
    assert len(out["meta_info"]["input_token_logprobs"]) == 3
    assert len(out["output_ids"]) == 300


def test_version_bumps_keep_counting() -> None:
    from areal.plugins.inference.embedded.engine import _next_version

    assert [_next_version(v) for v in ("0", "7", "v9", "policy")] == ["1", "8", "v10", "policy-1"]


def test_a_client_that_goes_away_aborts_its_generation(start_server: Any) -> None:
    """A non-streaming ``/generate`` whose client disconnects (a gateway that gave up on the
    call) stops decoding at once, as in SGLang and vLLM, instead of running to max_new_tokens;
    a streaming one too. The other request keeps going."""
    with start_server() as srv, ThreadPoolExecutor(1) as pool:
        other = pool.submit(
            _post, srv.url, "/generate", {"input_ids": [6], "sampling_params": LONG, "rid": "b"}
        )
        wait_decoding(srv.stats)
        for stream in (False, True):
            body = {"input_ids": [5], "sampling_params": LONG, "stream": stream}
            with bare_request(srv.url, "/generate", body):
                eventually(
                    lambda: srv.stats()["running"] == 2, DECODE_S, f"stream={stream}: decoding"
                )
            # the client went away mid-generation
            eventually(
                lambda: srv.stats()["running"] == 1, DECODE_S, f"stream={stream}: decoding stopped"
            )
            assert not other.done()
        _post(srv.url, "/abort_request", {"abort_all": True})
        assert other.result(timeout=30).json()["meta_info"]["finish_reason"]["type"] == "abort"


def test_a_control_call_whose_client_goes_away_leaves_the_engine_serving(
    start_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``/pause_generation`` whose client goes away while the engine thread is busy (here:
    held by a call of our own) is cancelled with its handler; the engine must skip it when its
    turn comes, not die setting the result of a cancelled future (a trainer whose weight-sync
    call timed out does exactly this), and must not pause for a caller that left."""
    with start_server() as srv:
        engine = srv.server.engine
        held, release = threading.Event(), threading.Event()
        busy = engine.call(lambda: (held.set(), release.wait(30)))
        assert held.wait(10)
        calls: list[Future[Any]] = []  # what the HTTP layer hands the engine thread from now on
        real_call = engine.call

        def recording(fn: Any) -> Future[Any]:
            calls.append(real_call(fn))
            return calls[-1]

        monkeypatch.setattr(engine, "call", recording)
        with bare_request(srv.url, "/pause_generation", {"mode": "abort"}) as client:
            eventually(lambda: calls, DECODE_S, "the pause queued behind the held engine thread")
            client.setblocking(False)
            with pytest.raises(BlockingIOError):  # nothing to read: no answer yet
                client.recv(1)
        eventually(lambda: calls[0].cancelled(), DECODE_S, "the server cancelling the pause")
        release.set()
        busy.result(timeout=10)
        out = srv.generate(input_ids=[3, 1, 4], sampling_params={"max_new_tokens": 4})
        assert len(out["output_ids"]) == 4 and engine.alive and not engine.paused
