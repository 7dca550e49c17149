"""Which engine a call goes to: the live one running the fewest calls (in turn among equals), so
an engine attached to a busy gateway takes the new calls until it carries its share; a sticky key
keeps its engine. Real pool and engine clients; the calls are real futures left running."""

from __future__ import annotations

import asyncio
from collections import Counter

from areal.gateway.engine_pool import Engine, EnginePool

URLS = ("http://127.0.0.1:30001", "http://127.0.0.1:30002")


def pool_of(*urls: str) -> EnginePool:
    pool = EnginePool(health_every=0)
    for url in urls:
        pool.add(Engine(url=url, client=pool.client_for(url), backend="embedded"))
    return pool


def test_idle_engines_take_turns_and_a_busy_one_waits_for_its_share() -> None:
    async def run() -> None:
        pool = pool_of(*URLS)
        first, second = (pool.engines[url] for url in URLS)
        assert Counter(pool.pick().url for _ in range(10)) == {URLS[0]: 5, URLS[1]: 5}
        loop = asyncio.get_running_loop()
        first.calls.update(loop.create_future() for _ in range(3))  # a backlog on the first
        picks = []
        for _ in range(4):
            engine = pool.pick()
            picks.append(engine.url)
            engine.calls.add(loop.create_future())  # the call now runs there
        assert picks == [URLS[1], URLS[1], URLS[1], picks[3]]  # then even: either in turn
        assert len(second.calls) >= 3
        for url in ("a", "b", "c"):  # a sticky key ignores the load
            assert len({pool.pick(f"session-{url}").url for _ in range(5)}) == 1
        first.draining = True
        assert {pool.pick().url for _ in range(4)} == {URLS[1]}
        await pool.close()

    asyncio.run(run())
