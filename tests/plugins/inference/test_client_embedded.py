"""The async :class:`InferenceClient` against the real embedded server: every call the rollout
code and the trainer's weight sync make, end to end over HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
import torch

from areal.core.inference_records import (
    GenerateOutput,
    InferenceError,
    SamplingParams,
    StreamOutput,
)
from areal.plugins.inference.sglang_client import InferenceClient
from support import eventually_async
from support.engines import DECODE_S, queued, wait_decoding_async

PROMPT = [11, 402, 77, 1500, 9, 333]
GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
# Long enough that it is still running whatever the machine's speed when the test acts on it.
LONG = SamplingParams(max_new_tokens=4000, temperature=1.0, ignore_eos=True)


def run(url: str, scenario: Callable[[InferenceClient], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        async with InferenceClient(url, timeout=60) as client:
            return await asyncio.wait_for(scenario(client), timeout=60)

    return asyncio.run(main())


def teacher_forced_greedy(model: Any, prompt: list[int], output: list[int]) -> torch.Tensor:
    """Plain log-softmax of ``output`` under ``model``: what greedy requests report."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output]))[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1)[torch.arange(len(output)), torch.tensor(output)]


# --- info and health ---------------------------------------------------------------------------


def test_health_wait_healthy_and_model_info(server: Any, nano_model_dir: str) -> None:
    async def scenario(client: InferenceClient) -> dict[str, Any]:
        assert await client.health()
        await client.wait_healthy(timeout=5)
        return await client.model_info()

    info = run(server.url, scenario)
    assert info["weight_version"] == "0"
    assert info["model_path"] == nano_model_dir
    assert info["model_type"] == "qwen3"
    assert info["is_generation"] is True


def test_health_is_false_once_the_server_is_gone(start_server: Any) -> None:
    with start_server() as srv:
        url = srv.url
        assert run(url, lambda c: c.health())
    assert run(url, lambda c: c.health(timeout=1)) is False


# --- generation --------------------------------------------------------------------------------


def test_generate_by_ids_with_logprobs(server: Any, reference_model: Any) -> None:
    params = SamplingParams(max_new_tokens=10, temperature=1.0, ignore_eos=True, sampling_seed=3)

    async def scenario(client: InferenceClient) -> tuple[GenerateOutput, GenerateOutput]:
        sampled = await client.generate(input_ids=PROMPT, sampling_params=params, rid="client-ids")
        greedy = await client.generate(input_ids=PROMPT, sampling_params=GREEDY)
        return sampled, greedy

    sampled, greedy = run(server.url, scenario)
    assert len(sampled.output_ids) == 10 and sampled.completion_tokens == 10
    assert len(sampled.output_logprobs) == len(sampled.output_ids)
    assert all(math.isfinite(lp) and lp <= 0 for lp in sampled.output_logprobs)
    assert sampled.token_versions() == ["0"] * 10
    assert sampled.weight_version == "0"
    assert sampled.finish_reason is not None and sampled.finish_reason.type == "length"
    assert sampled.finish_reason.length == 10
    assert sampled.prompt_tokens == len(PROMPT)
    assert sampled.rid == "client-ids"
    assert isinstance(sampled.text, str)
    # Greedy log-probs, parsed by the client, equal a teacher-forced pass of the same weights.
    expected = teacher_forced_greedy(reference_model, PROMPT, greedy.output_ids)
    torch.testing.assert_close(torch.tensor(greedy.output_logprobs), expected, atol=1e-4, rtol=0)


def test_generate_by_text_equals_its_token_ids(server: Any) -> None:
    text = "The quick brown fox jumps over the lazy dog."
    ids = server.server.tokenizer.encode(text)

    async def scenario(client: InferenceClient) -> tuple[GenerateOutput, GenerateOutput]:
        by_text = await client.generate(text=text, sampling_params=GREEDY)
        by_ids = await client.generate(input_ids=ids, sampling_params=GREEDY)
        return by_text, by_ids

    by_text, by_ids = run(server.url, scenario)
    assert by_text.prompt_tokens == len(ids)
    assert by_text.output_ids == by_ids.output_ids and len(by_text.output_ids) == 12
    assert by_text.output_logprobs == pytest.approx(by_ids.output_logprobs, abs=1e-5)
    assert len(by_text.output_logprobs) == 12
    assert by_text.token_versions() == ["0"] * 12
    assert (
        by_text.text
        == by_ids.text
        == server.server.tokenizer.decode(by_ids.output_ids, skip_special_tokens=True)
    )


def test_stream_grows_to_the_non_stream_result(server: Any) -> None:
    async def scenario(client: InferenceClient) -> tuple[list[GenerateOutput], GenerateOutput]:
        stream = client.generate_stream(input_ids=PROMPT, sampling_params=GREEDY)
        chunks = [c.snapshot() async for c in stream if isinstance(c, StreamOutput)]
        whole = await client.generate(input_ids=PROMPT, sampling_params=GREEDY)
        return chunks, whole

    chunks, whole = run(server.url, scenario)
    assert len(chunks) >= 2
    previous: list[int] = []
    for chunk in chunks:
        assert len(chunk.output_ids) > len(previous)
        assert chunk.output_ids[: len(previous)] == previous  # grows, never rewrites
        assert chunk.delta_output_ids == chunk.output_ids[len(previous) :]
        assert len(chunk.output_logprobs) == len(chunk.output_ids)
        previous = list(chunk.output_ids)
    assert [c.finished for c in chunks] == [False] * (len(chunks) - 1) + [True]
    final = chunks[-1]
    assert final.output_ids == whole.output_ids
    assert final.output_logprobs == pytest.approx(whole.output_logprobs, abs=1e-5)
    assert final.text == whole.text
    assert final.finish_reason == whole.finish_reason
    assert final.token_versions() == whole.token_versions() == ["0"] * 12


def test_server_400_becomes_inference_error_with_its_message(server: Any, tmp_path: Path) -> None:
    bad = {"max_new_tokens": 0}

    async def scenario(client: InferenceClient) -> list[InferenceError]:
        errors = []
        for call in (
            lambda: client.generate(input_ids=PROMPT, sampling_params=bad),
            lambda: anext(client.generate_stream(input_ids=PROMPT, sampling_params=bad)),
            lambda: client.update_weights_from_disk(str(tmp_path / "missing")),
        ):
            with pytest.raises(InferenceError) as err:
                await call()
            errors.append(err.value)
        return errors

    plain, stream, weights = run(server.url, scenario)
    for err in (plain, stream):
        assert err.status_code == 400
        assert "max_new_tokens" in err.message and "positive" in err.message
        assert err.err_type == "invalid_request_error" and err.retryable is False
        assert err.url.endswith("/generate") and err.message in str(err)
    assert weights.status_code == 400 and "is not a directory" in weights.message
    assert weights.url.endswith("/update_weights_from_disk")
    # The refused weight update changed nothing.
    assert run(server.url, lambda c: c.model_info())["weight_version"] == "0"


# --- scheduling control ------------------------------------------------------------------------


def test_pause_abort_returns_partial_output_and_continue_resumes(start_server: Any) -> None:
    async def scenario(client: InferenceClient) -> None:
        running = asyncio.create_task(
            client.generate(input_ids=[5, 6], sampling_params=LONG, rid="long")
        )
        await wait_decoding_async(client.server_info)
        assert (await client.pause_generation("abort"))["status"] == "ok"
        out = await running
        assert out.aborted and out.rid == "long"
        assert 0 < len(out.output_ids) < 4000
        assert len(out.output_logprobs) == len(out.output_ids)
        assert out.token_versions() == ["0"] * len(out.output_ids)

        waiting = asyncio.create_task(
            client.generate(input_ids=[7], sampling_params={"max_new_tokens": 3})
        )

        async def held() -> bool:
            return queued(await client.server_info())

        await eventually_async(held, DECODE_S, "the request queued at the paused engine")
        # a later turn of the engine's loop still holds it
        assert await held() and not waiting.done(), "a request was served while paused"
        assert (await client.continue_generation())["status"] == "ok"
        done = await waiting
        assert done.completion_tokens == 3 and not done.aborted

    with start_server() as srv:
        run(srv.url, scenario)


def test_abort_request_by_rid_then_all_and_flush_cache(server: Any) -> None:
    async def scenario(client: InferenceClient) -> None:
        assert await client.flush_cache() is True  # idle
        a = asyncio.create_task(client.generate(input_ids=[5], sampling_params=LONG, rid="a"))
        b = asyncio.create_task(client.generate(input_ids=[6], sampling_params=LONG, rid="b"))
        await wait_decoding_async(client.server_info, 2)
        await client.abort_request("a")
        out_a = await a
        assert out_a.aborted and out_a.rid == "a" and 0 < len(out_a.output_ids) < 4000
        assert not b.done()
        assert await client.flush_cache() is False  # b still runs
        await client.abort_request("no-such-request")  # unknown rids are not an error
        assert not b.done()
        await client.abort_request(abort_all=True)
        out_b = await b
        assert out_b.aborted and out_b.rid == "b"
        assert await client.flush_cache() is True
        with pytest.raises(ValueError, match="rid"):
            await client.abort_request()

    run(server.url, scenario)


# --- weights -----------------------------------------------------------------------------------


def test_update_weights_from_disk_and_a_request_spanning_it(
    perturbed: Any, start_server: Any, nano_model_dir: str, reference_model: Any, tmp_path: Path
) -> None:
    """Pause in place, load new weights, continue: the request that spans the update says which
    tokens each version produced, and later requests run on the new weights."""
    new_model = perturbed(nano_model_dir, tmp_path / "v1", seed=11)
    spanning = SamplingParams(max_new_tokens=300, temperature=1.0, ignore_eos=True)

    async def scenario(client: InferenceClient) -> None:
        before = await client.generate(input_ids=PROMPT, sampling_params=GREEDY)
        assert before.weight_version == "0"
        seen_before_pause = 0
        final: GenerateOutput | None = None
        stream = client.generate_stream(input_ids=[5, 6], sampling_params=spanning)
        async with aclosing(stream):
            async for chunk in stream:
                final = chunk
                if seen_before_pause == 0 and len(chunk.output_ids) >= 5:
                    await client.pause_generation("in_place")
                    seen_before_pause = len(chunk.output_ids)
                    assert await client.flush_cache() is False  # frozen, not finished
                    info = await client.server_info()
                    assert info["paused"] is True and info["running"] == 1
                    result = await client.update_weights_from_disk(str(tmp_path / "v1"))
                    assert result["success"] is True
                    assert (await client.model_info())["weight_version"] == "1"
                    await client.continue_generation()
        assert final is not None and final.finished and not final.aborted
        assert len(final.output_ids) == 300 and len(final.output_logprobs) == 300
        assert final.weight_version == "1"
        assert [s.version for s in final.weight_versions] == ["0", "1"]
        switch = final.weight_versions[0].end
        assert final.weight_versions[1].start == switch and final.weight_versions[1].end == 300
        assert seen_before_pause <= switch < 300
        assert final.token_versions() == ["0"] * switch + ["1"] * (300 - switch)

        after = await client.generate(input_ids=PROMPT, sampling_params=GREEDY)
        assert after.weight_version == "1" and after.token_versions() == ["1"] * 12
        # The new logprobs are those of the perturbed weights, not of the old ones.
        expected = teacher_forced_greedy(new_model, PROMPT, after.output_ids)
        torch.testing.assert_close(torch.tensor(after.output_logprobs), expected, atol=1e-4, rtol=0)
        old = teacher_forced_greedy(reference_model, PROMPT, after.output_ids)
        assert float((old - expected).abs().max()) > 1e-3

    with start_server() as srv:
        run(srv.url, scenario)
