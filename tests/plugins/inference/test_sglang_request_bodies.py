"""What InferenceClient sends, built into SGLang's own request structs (``io_struct``) and
``SamplingParams`` in the SGLang venv: a misspelled field is a TypeError there, so it fails here.

The bodies are the ones the client really sends, recorded by an aiohttp server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web

from areal.core.inference_records import SamplingParams
from areal.gateway.chat_messages import forced_plan, grammar_params
from areal.gateway.openai_chat import _extra_sampling
from areal.gateway.policy import PolicyService
from areal.gateway.router_config import ModelRoute
from areal.plugins.inference.sglang_client import InferenceClient
from areal.plugins.tool_parsers.hermes import HermesParser

CLASS_OF = {
    "/generate": "GenerateReqInput",
    "/pause_generation": "PauseGenerationReqInput",
    "/continue_generation": "ContinueGenerationReqInput",
    "/abort_request": "AbortReq",
    "/update_weights_from_disk": "UpdateWeightFromDiskReqInput",
    "/update_weight_version": "UpdateWeightVersionReqInput",
    "/init_weights_update_group": "InitWeightsUpdateGroupReqInput",
    "/update_weights_from_distributed": "UpdateWeightsFromDistributedReqInput",
    "/destroy_weights_update_group": "DestroyWeightsUpdateGroupReqInput",
}
DONE = {
    "output_ids": [5],
    "meta_info": {"finish_reason": {"type": "length"}, "weight_versions": []},
}


async def _record_every_call() -> list[tuple[str, dict[str, Any]]]:
    seen: list[tuple[str, dict[str, Any]]] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append((request.path, body))
        if request.path != "/generate":
            return web.json_response({"success": True, "message": "ok"})
        if not body.get("stream"):
            return web.json_response(DONE)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: " + json.dumps(DONE).encode() + b"\n\ndata: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/{path:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    params = SamplingParams(max_new_tokens=4, temperature=0.7, top_p=0.9, stop=["\n"])
    try:
        async with InferenceClient(url) as c:
            await c.generate(input_ids=[1, 2], sampling_params=params, rid="r1")
            async for _ in c.generate_stream(text="hi", sampling_params={"max_new_tokens": 2}):
                pass
            await c.pause_generation("retract")
            await c.continue_generation()
            await c.abort_request(rid="r1")
            await c.abort_request(abort_all=True)
            await c.update_weights_from_disk("/ckpt/1", weight_version="1", load_format="auto")
            await c.update_weight_version("2")
            await c.init_weights_update_group(
                master_address="127.0.0.1", master_port=1234, rank_offset=1, world_size=3,
                group_name="g", backend="gloo",
            )  # fmt: skip
            await c.update_weights_from_distributed(
                names=["w"], dtypes=["float32"], shapes=[[2, 3]], group_name="g",
                weight_version="3", load_format="flattened_bucket",
            )  # fmt: skip
            await c.destroy_weights_update_group("g")
    finally:
        await runner.cleanup()
    return seen


def _gateway_sampling() -> dict[str, Any]:
    """Every sampling key the gateway can send: the route's, the client's and the extras."""
    policy = PolicyService(
        ["http://127.0.0.1:1"], ModelRoute(model_id="policy", temperature=1.0, top_p=0.95)
    )
    body = {"presence_penalty": 0.5, "frequency_penalty": 0.1, "repetition_penalty": 1.1,
            "ignore_eos": True, "top_k": 20, "min_p": 0.05, "min_tokens": 2,
            "logit_bias": {"7": -1.0}}  # fmt: skip
    extra = {**_extra_sampling(body), "json_schema": '{"type": "object"}'}
    return policy.sampling(3, max_tokens=16, stop=["\n"], seed=7, extra=extra)


def _forced_call_sampling() -> dict[str, Any]:
    """What a forced tool call asks of the engine: the call's structural tag, as a string."""
    tool = {"type": "function", "function": {"name": "paint", "parameters": {"type": "object"}}}
    plan = forced_plan([tool], HermesParser(), ["paint"])
    return {"max_new_tokens": 16, **grammar_params(plan)}


@pytest.fixture(scope="module")
def checked(sglang_probe: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
    seen = asyncio.run(_record_every_call())
    assert {path for path, _ in seen} == set(CLASS_OF)
    requests = [[CLASS_OF[path], body] for path, body in seen]
    requests.append(["UpdateWeightVersionReqInput", {"new_verison": "2"}])  # misspelled
    sampling = [
        _gateway_sampling(),
        SamplingParams(max_new_tokens=3).to_json(),
        _forced_call_sampling(),
        {"top_kk": 3},
    ]
    return {"seen": seen, **sglang_probe({"requests": requests, "sampling": sampling})}


def test_sglang_builds_every_body_the_client_sends(checked: dict[str, Any]) -> None:
    for (path, body), result in zip(checked["seen"], checked["requests"], strict=False):
        assert result["ok"], f"{path}: {result['error']}"
        assert result["fields"] == body, path  # SGLang read every field as we meant it


def test_a_misspelled_field_is_refused_by_sglang(checked: dict[str, Any]) -> None:
    assert "new_verison" in checked["requests"][-1]["error"]
    assert "top_kk" in checked["sampling"][-1]["error"]


def test_sglang_takes_the_gateways_sampling_params(checked: dict[str, Any]) -> None:
    gateway, plain = checked["sampling"][:2]
    assert gateway["ok"], gateway["error"]
    assert plain["ok"], plain["error"]
    assert gateway["fields"]["top_k"] == 20 and gateway["fields"]["sampling_seed"] == 7


def test_sglang_takes_a_forced_calls_structural_tag(checked: dict[str, Any]) -> None:
    forced = checked["sampling"][2]
    assert forced["ok"], forced["error"]
    assert forced["fields"] == _forced_call_sampling()  # a string SGLang hands xgrammar as it is
