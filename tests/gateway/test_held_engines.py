"""Once a trainer has announced a version, the gateway routes no call to an engine that does not
serve it (attached with SGLang's and vLLM's start-up label ``"default"``, an older version, or
another run's) while another engine can take the call; the engine takes traffic once the
trainer's next publish reaches it and the trainer announces that version. Real gateway app, real
embedded engines, all on 127.0.0.1; the pool's rules also on the pool itself."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from areal.gateway.engine_pool import Engine, EnginePool
from support import eventually
from support.engines import running_server
from support.gateway import ADMIN_TOKEN, GATEWAY_KEY, POLICY, running_gateway
from support.http import bearer

ADMIN = bearer(ADMIN_TOKEN)
URLS = [f"http://127.0.0.1:{30001 + i}" for i in range(4)]


def attach(pool: EnginePool, url: str, label: str) -> Engine:
    return pool.add(Engine(url, pool.client_for(url), "embedded", weight_version=label))


def test_held_engines_take_calls_only_when_no_other_engine_can() -> None:
    async def run() -> None:
        pool = EnginePool(health_every=0)
        alone = attach(pool, URLS[0], "default")
        assert not alone.held  # no trainer: a gateway serving on its own holds nothing
        await pool.detach(URLS[0])
        pool.announced(3)
        current = attach(pool, URLS[0], "3")
        held = [attach(pool, URLS[1], "default"), attach(pool, URLS[2], "2")]
        held.append(attach(pool, URLS[3], "9"))  # another run's label
        assert not current.held and all(e.held for e in held)
        assert {e["url"]: e["held"] for e in pool.describe()} == {
            URLS[0]: False,
            URLS[1]: True,
            URLS[2]: True,
            URLS[3]: True,
        }
        assert {pool.pick().url for _ in range(6)} == {URLS[0]}
        # Nothing else live: the held engines serve (their labels say what they serve), so a
        # run whose every engine is held still produces the batch that publishes its version.
        current.draining = True
        assert {pool.pick().url for _ in range(6)} == set(URLS[1:])
        pool.announced(None)  # the trainer left: no run, nothing held
        assert not any(e.held for e in held)
        await pool.close()

    asyncio.run(run())


def chat(gateway: str) -> None:
    body = {"model": POLICY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    answer = httpx.post(
        gateway + "/v1/chat/completions", json=body, headers=bearer(GATEWAY_KEY), timeout=60
    )
    assert answer.status_code == 200, answer.text


def listed(gateway: str) -> dict[str, dict[str, Any]]:
    answer = httpx.get(gateway + "/rl/engines", headers=ADMIN, timeout=30)
    assert answer.status_code == 200, answer.text
    return {e["url"]: e for e in answer.json()["engines"]}


def announce(gateway: str, version: int) -> None:
    answer = httpx.post(gateway + "/rl/version", json={"version": version}, headers=ADMIN)
    assert answer.status_code == 200, answer.text


@pytest.mark.slow
def test_an_engine_attached_off_the_run_version_serves_once_a_publish_reaches_it(
    gateway_model_dir: str, tmp_path: Path
) -> None:
    with (
        running_server(gateway_model_dir, weight_version="3") as current,
        running_server(gateway_model_dir, weight_version="default") as late,
        running_gateway(current.url, current.server, tmp_path) as gw,
    ):
        announce(gw.url, 3)  # the run's first announce reads the engine attached before it
        eventually(lambda: not listed(gw.url)[current.url]["held"], 60, "the engine at v3 served")
        attached = httpx.post(gw.url + "/rl/engines", json={"url": late.url}, headers=ADMIN)
        assert attached.status_code == 201, attached.text
        assert attached.json()["held"] and attached.json()["weight_version"] == "default"
        for _ in range(4):
            chat(gw.url)
        engines = listed(gw.url)
        assert (engines[current.url]["served"], engines[late.url]["served"]) == (4, 0)

        # The trainer's next publish reaches both engines (as its sync labels them), then it
        # announces the version: the late engine serves the run's version and takes calls.
        for engine in (current, late):
            engine.http.post("/update_weight_version", json={"new_version": "4"})
        announce(gw.url, 4)
        eventually(lambda: not listed(gw.url)[late.url]["held"], 60, "the late engine let in")
        assert listed(gw.url)[late.url]["weight_version"] == "4"
        for _ in range(4):
            chat(gw.url)
        assert listed(gw.url)[late.url]["served"] > 0
