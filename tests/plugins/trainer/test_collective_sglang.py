"""The trainer's side of the collective weight sync meets real SGLang: two SGLang ranks (one engine
at tp_size 2) join with SGLang's own ``init_custom_process_group`` over gloo on CPU, in
subprocesses of the SGLang venv, and receive what the trainer broadcasts."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import torch

from areal.plugins.trainer.collective_sync import CollectiveWeightSync

RECEIVE = Path(__file__).parents[2] / "in_sglang_venv" / "receive.py"


def test_sglang_ranks_join_the_trainers_group_and_receive_its_broadcast(
    sglang_venv_python: Path, sglang_env: Callable[[], dict[str, str]]
) -> None:
    sync = CollectiveWeightSync(
        ["http://127.0.0.1:1"], backend="gloo", tp_size=2, update_timeout=60
    )
    world = 1 * 2 + 1  # engines * tp_size + the trainer
    assert sync._rank_offsets(1) == [1]
    store, name = sync._new_store(world), "areal-weights-test"
    port = store.port
    ranks = [
        subprocess.Popen(
            [str(sglang_venv_python), str(RECEIVE), "127.0.0.1", str(port), str(world),
             str(1 + tp_rank), name, "5"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=sglang_env(),
        )
        for tp_rank in range(2)
    ]  # fmt: skip
    try:
        group = sync._make_group(store, world, name)
        sent = torch.arange(5, dtype=torch.float32) * 1.5
        group.broadcast(sent, 0).wait()
        answers = [rank.communicate(timeout=120) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    for process, (_out, err) in zip(ranks, answers, strict=True):
        assert process.returncode == 0, err[-3000:]
    got = [json.loads(out.strip().splitlines()[-1]) for out, _ in answers]
    assert [a["rank"] for a in sorted(got, key=lambda a: a["rank"])] == [1, 2]
    assert all(a["tensor"] == sent.tolist() for a in got)
