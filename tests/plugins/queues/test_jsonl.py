"""The JSONL trajectory sink, found through the queue registry as the gateway finds it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from areal.core.queue import make_sink
from areal.core.registry import RegistryError
from areal.core.types import Completion, Sample, Trajectory


def trajectory(i: int, size: int = 2000) -> Trajectory:
    ids = list(range(size))
    sample = Sample(
        input_ids=ids,
        loss_mask=[i % 2] * size,
        logprobs=[-0.5] * size,
        versions=[i] * size,
        reward=float(i),
        completion_ids=[f"c{i}"],
    )
    turn = Completion(f"c{i}", f"s{i}", 0, "policy", ids[:2], ids[2:], [-0.5] * (size - 2),
                      [i] * (size - 2), "stop", reward=float(i))  # fmt: skip
    return Trajectory(f"s{i}", [sample], float(i), 1, {"task_id": i}, turns=[turn])


def test_concurrent_puts_give_whole_lines_and_reopening_appends(tmp_path: Path) -> None:
    path = tmp_path / "out" / "trajectories.jsonl"
    sent = [trajectory(i) for i in range(45)]

    async def write(batch: range) -> None:
        sink = make_sink("jsonl", {"path": str(path)})
        await asyncio.gather(*(sink.put(sent[i]) for i in batch))
        await sink.close()
        await sink.close()  # closing twice is harmless

    asyncio.run(write(range(40)))
    asyncio.run(write(range(40, 45)))
    lines = path.read_text().splitlines()
    assert len(lines) == 45
    got = sorted(
        (Trajectory.from_json(json.loads(line)) for line in lines), key=lambda t: t.session_id
    )
    assert got == sorted(sent, key=lambda t: t.session_id)


def test_put_after_close_fails_loudly(tmp_path: Path) -> None:
    async def go() -> None:
        sink = make_sink("jsonl", {"path": str(tmp_path / "t.jsonl")})
        await sink.close()
        with pytest.raises(RuntimeError, match="closed"):
            await sink.put(trajectory(0, size=3))

    asyncio.run(go())


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match=r"options\.path"):
        make_sink("jsonl", {})
    with pytest.raises(ValueError, match="no option"):
        make_sink("jsonl", {"path": "x.jsonl", "compress": True})
    with pytest.raises(RegistryError, match=r"registered: .*jsonl"):
        make_sink("nope", {})
