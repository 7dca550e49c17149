"""Collective weight sync over gloo: this test plays the trainer (rank 0, owner of the store) and
broadcasts a new checkpoint to the real server while its HTTP call is in flight, as AReaL does
with SGLang over NCCL."""

from __future__ import annotations

import datetime
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import torch
import torch.distributed as dist

from areal.core.weight_group import new_weight_group
from areal.plugins.models.hf_io import to_checkpoint

TIMEOUT = datetime.timedelta(seconds=60)


def _trainer_store(world_size: int = 2) -> dist.TCPStore:
    """The store rank 0 owns, on port 0: bound to a port the OS picks at once, so no other
    process can take it between picking and binding (``store.port`` says which)."""
    return dist.TCPStore("127.0.0.1", 0, world_size, True, timeout=TIMEOUT, wait_for_workers=False)


def _trainer_group(store: dist.TCPStore, group_name: str, world_size: int = 2) -> dist.ProcessGroup:
    """Rank 0 as areal's trainer forms it: SGLang's PrefixStore scheme on a store it owns."""
    return new_weight_group(
        store, rank=0, world_size=world_size, group_name=group_name, backend="gloo", timeout=TIMEOUT
    )


def _join(srv: Any, pool: ThreadPoolExecutor, group_name: str) -> dist.ProcessGroup:
    store = _trainer_store()
    body = {
        "master_address": "127.0.0.1",
        "master_port": store.port,
        "rank_offset": 1,
        "world_size": 2,
        "group_name": group_name,
        "backend": "gloo",
    }
    joined = pool.submit(httpx.post, f"{srv.url}/init_weights_update_group", json=body, timeout=60)
    group = _trainer_group(store, group_name)
    resp = joined.result(timeout=60)
    assert resp.status_code == 200 and resp.json()["success"], resp.text
    return group


def _new_weights(perturb: Any, model_dir: str) -> tuple[Any, dict[str, torch.Tensor]]:
    model = perturb(model_dir)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied
    return model, to_checkpoint(state)


def _greedy_matches(srv: Any, model: Any) -> None:
    prompt = [3, 1, 4, 1, 5, 9]
    out = srv.generate(
        input_ids=prompt,
        sampling_params={"max_new_tokens": 10, "temperature": 0, "ignore_eos": True},
    )
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out["output_ids"]]))[0, len(prompt) - 1 : -1]
    assert out["output_ids"] == logits.argmax(-1).tolist()


@pytest.mark.parametrize("flattened", [False, True])
def test_broadcast_weights_to_the_engine(
    perturbed: Any, start_server: Any, nano_model_dir: str, flattened: bool
) -> None:
    model, tensors = _new_weights(perturbed, nano_model_dir)
    names = sorted(tensors)
    with start_server() as srv, ThreadPoolExecutor(1) as pool:
        group = _join(srv, pool, "wg")
        body = {
            "names": names,
            "dtypes": ["float32"] * len(names),
            "shapes": [list(tensors[n].shape) for n in names],
            "group_name": "wg",
            "weight_version": "3",
            "load_format": "flattened_bucket" if flattened else None,
        }
        call = pool.submit(
            httpx.post, f"{srv.url}/update_weights_from_distributed", json=body, timeout=60
        )
        if flattened:
            group.broadcast(torch.cat([tensors[n].reshape(-1) for n in names]), 0).wait()
        else:
            for n in names:
                group.broadcast(tensors[n].contiguous(), 0).wait()
        resp = call.result(timeout=60)
        assert resp.status_code == 200 and resp.json()["success"], resp.text
        assert srv.http.get("/model_info").json()["weight_version"] == "3"
        _greedy_matches(srv, model)
        assert srv.http.post("/destroy_weights_update_group", json={"group_name": "wg"}).json()[
            "success"
        ]


def test_group_errors_are_clear(start_server: Any) -> None:
    with start_server() as srv:
        nccl = srv.http.post(
            "/init_weights_update_group",
            json={
                "master_address": "127.0.0.1",
                "master_port": 1234,
                "rank_offset": 1,
                "world_size": 2,
                "backend": "nccl",
            },
        )
        assert nccl.status_code == 400 and "needs GPUs" in nccl.json()["error"]["message"]
        no_group = srv.http.post(
            "/update_weights_from_distributed",
            json={
                "names": ["model.norm.weight"],
                "dtypes": ["float32"],
                "shapes": [[64]],
                "group_name": "none",
            },
        )
        assert (
            no_group.status_code == 400
            and "init_weights_update_group" in no_group.json()["error"]["message"]
        )
        assert (
            srv.http.post("/destroy_weights_update_group", json={"group_name": "none"}).status_code
            == 400
        )


def test_wrong_shapes_change_nothing(start_server: Any, nano_model_dir: str) -> None:
    with start_server() as srv, ThreadPoolExecutor(1) as pool:
        before = srv.generate(
            input_ids=[7, 7],
            sampling_params={"max_new_tokens": 6, "temperature": 0, "ignore_eos": True},
        )
        group = _join(srv, pool, "wg")
        body = {
            "names": ["model.norm.weight"],
            "dtypes": ["float32"],
            "shapes": [[3]],
            "group_name": "wg",
        }
        call = pool.submit(
            httpx.post, f"{srv.url}/update_weights_from_distributed", json=body, timeout=60
        )
        group.broadcast(torch.zeros(3), 0).wait()
        resp = call.result(timeout=60)
        assert resp.status_code == 400 and resp.json()["success"] is False
        assert "model.norm.weight has shape (3,)" in resp.json()["message"]
        after = srv.generate(
            input_ids=[7, 7],
            sampling_params={"max_new_tokens": 6, "temperature": 0, "ignore_eos": True},
        )
        assert after["output_ids"] == before["output_ids"]
        assert srv.http.get("/model_info").json()["weight_version"] == "0"


def test_a_bucket_of_an_unknown_dtype_is_refused_before_anything_is_received(
    start_server: Any,
) -> None:
    """Refused on its metadata: the trainer's broadcast is never waited for (no rank 0 sends
    here), and the answer names the dtype and the ones that are taken."""
    with start_server() as srv, ThreadPoolExecutor(1) as pool:
        _join(srv, pool, "wg")
        body = {
            "names": ["model.norm.weight"],
            "dtypes": ["int8"],
            "shapes": [[64]],
            "group_name": "wg",
        }
        resp = httpx.post(f"{srv.url}/update_weights_from_distributed", json=body, timeout=30)
        assert resp.status_code == 400
        message = resp.json()["error"]["message"]
        assert "['int8'] are not supported" in message and "bfloat16" in message
