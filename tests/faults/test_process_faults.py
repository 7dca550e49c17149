"""A real ``areal train`` run (the quickstart, small) survives its processes failing, each fault
injected by signal at a random step, and its books and audit trail say exactly what happened:
nothing trained twice, nothing lost that the trainer had acknowledged.

- an engine SIGKILLed, then the rollout worker SIGKILLed, then the engine SIGSTOPped while the
  trainer waits at the start of a weight sync (one run, the faults one after another, each
  checked on its own): the supervisor restarts each; the sync's watchdog names the stopped
  engine in one line and it is killed and restarted like a dead one;
- the trainer itself (``areal train``) SIGKILLed: every process it started dies with it (gone
  within the time the product gives a SIGKILLed process, ``KILLED_EXIT_S``), its ports are
  free, and ``--resume`` finishes from the last checkpoint.

The steps are drawn from ``AREAL_FAULT_SEED`` (random unless set); a failure prints the seed.
Whole ``areal train`` runs: the serial tier.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from areal.host.ports import port_holders
from areal.host.process import KILLED_EXIT_S
from areal.run.checkpoint import latest_checkpoint, load_checkpoint
from support import eventually
from support.runs import SMALL, TRAINER, Fault, identity_breaks, run
from support.wait import NeverHappened

pytestmark = [pytest.mark.slow, pytest.mark.serial]

SEED = int(os.environ.get("AREAL_FAULT_SEED") or random.randrange(1_000_000))
WATCHDOG_S = 5  # inference.weight_sync_timeout_s: a healthy sync's calls answer in ~10 ms here


def _why(seed: int, done: Any, **where: Any) -> str:
    faults = ", ".join(f"{k}={v}" for k, v in where.items())
    tail = "\n".join(done.log.splitlines()[-25:])
    return f"AREAL_FAULT_SEED={seed} ({faults}); areal train's log ends:\n{tail}"


def _holders(ports: list[int]) -> dict[int, list[Any]]:
    """Who still listens on each of ``ports`` that is held."""
    held = {port: port_holders(port) for port in ports}
    return {port: who for port, who in held.items() if who}


def _holders_after_teardown(ports: list[int]) -> dict[int, list[Any]]:
    """Who still listens on ``ports`` once the kernel had the time it gets to tear a SIGKILLed
    process down (``KILLED_EXIT_S``). A process in teardown lets go of its file table before
    its listening socket leaves ``/proc/net/tcp``, so a socket may be listed a moment with no
    owner; a port some process really kept stays held and is reported with its owner."""
    with contextlib.suppress(NeverHappened):
        eventually(lambda: not _holders(ports), KILLED_EXIT_S, f"ports {ports} to be free")
    return _holders(ports)


def _once(records: list[dict[str, Any]]) -> list[str]:
    """What the audit trail has twice: a session, or a task's sample."""
    seen: set[Any] = set()
    twice = []
    for r in records:
        for key in (r["session_id"], (r.get("task_index"), r.get("sample"))):
            if key in seen:
                twice.append(str(key))
            seen.add(key)
    return twice


def test_an_engine_a_rollout_worker_and_a_stalled_weight_sync(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    engine_at = rng.randint(1, 3)
    worker_at = engine_at + rng.randint(2, 3)
    stall_at = worker_at + rng.randint(2, 3)
    # The stall strikes at the first sync once the worker is back (while it is down the trainer
    # has only what the staleness budget let through, one batch ahead), then two steps more.
    steps = stall_at + 4
    done = run(
        tmp_path / "out",
        steps=steps,
        faults=[
            Fault("engine0", engine_at),
            Fault("rollout0", worker_at),
            Fault("engine0", stall_at, signal.SIGSTOP, during_sync=True),
        ],
        overrides=(*SMALL, f"inference.weight_sync_timeout_s={WATCHDOG_S}"),
        timeout=300,
    )
    why = _why(SEED, done, engine=engine_at, rollout=worker_at, stall=stall_at, steps=steps)
    assert done.returncode == 0, why
    assert done.last("end")["stopped_by"] == "max_steps", why
    assert len(done.injected) == 3, (done.injected, why)  # all three struck
    killed, worker, stalled = done.injected
    assert stalled.pid == killed.back_pid, why  # the stall hit the restarted engine

    # Each fault on its own: the supervisor brought the process back, the run trained on after
    # it, and the episodes it cut short were discarded (not trained) before the next fault struck
    # (the run's journal read at each strike: an accounting line of the step before a strike may
    # have been written before the discard), the last one's by the end of the run.
    final = done.last("accounting")["episodes_discarded"]
    for hit, until, after in (
        (killed, worker.step, worker.discarded_before),
        (worker, stalled.step, stalled.discarded_before),
        (stalled, steps, final),
    ):
        assert hit.back_pid is not None and hit.back_pid != hit.pid, (hit, why)
        assert hit.step < until, (hit, why)
        before = hit.discarded_before
        assert before is not None and after is not None and after > before, (
            hit.fault,
            before,
            after,
            why,
        )
    restarts = done.last("accounting")["restarts"]
    assert restarts >= 3, why

    # The stopped engine: the sync's watchdog named it (name, URL, pid, the version) in one line
    # and killed it; the helper never had to let it go.
    assert stalled.sync_version is not None and not stalled.released, (stalled, why)
    named = [line for line in done.log.splitlines() if "the weight sync's watchdog:" in line]
    expected = (
        re.escape(
            f"the weight sync's watchdog: engine0 ({stalled.url}, pid {stalled.pid}) stalled in the "
            f"sync of version {stalled.sync_version} (weight sync "
        )
        + rf"(pause|update|continue) failed on {re.escape(stalled.url)}: no answer within {WATCHDOG_S} s\)"
    )
    assert len(named) == 1 and re.search(expected, named[0]), (named, why)

    # The books balance exactly at every step, through all three faults.
    assert identity_breaks(done.events) == [], why
    # Nothing trained twice; the audit trail and the books agree.
    assert _once(done.trained) == [], why
    assert len(done.trained) == done.last("accounting")["episodes_trained"], why
    assert {r["step"] for r in done.trained} == set(range(1, steps + 1)), why


def test_a_killed_trainer_takes_its_processes_along_and_resumes(tmp_path: Path) -> None:
    rng = random.Random(SEED + 1)
    kill_at = rng.randint(3, 5)
    steps = 7
    out = tmp_path / "out"
    overrides = (*SMALL, "logging.save_interval=2")
    first = run(
        out,
        steps=steps,
        faults=[Fault(TRAINER, kill_at)],
        overrides=overrides,
        timeout=240,
    )
    why = _why(SEED + 1, first, trainer=kill_at)
    (hit,) = first.injected
    assert first.returncode == -signal.SIGKILL, why
    # Every process areal train started died with it and left its ports free.
    assert {"engine0", "gateway", "rollout0"} <= set(hit.children.values()), (hit.children, why)
    assert hit.gone_after is not None and hit.left == [], (hit.left, why)
    assert len(hit.ports) >= 2, (hit.ports, why)
    holders = _holders_after_teardown(hit.ports)  # who, if a port is not free
    assert not any(holders.values()), (holders, why)

    found = latest_checkpoint(out)
    assert found is not None, why
    checkpoint = load_checkpoint(found)
    saved = checkpoint.step
    assert hit.step - 2 <= saved <= hit.step, (saved, hit.step, why)
    acknowledged = {t.session_id for t in checkpoint.pending}  # received, not trained yet

    second = run(out, steps=steps, overrides=overrides, resume=True, timeout=240)
    why = _why(SEED + 1, second, trainer=kill_at, checkpoint=saved)
    assert second.returncode == 0, why
    assert f"resuming from {found} (step {saved})" in second.log, why
    assert second.all("run")[-1]["step"] == saved, why

    # The audit trail: the killed run's steps after the checkpoint died with it (their updates
    # were never saved), so the run that counts is the first run up to the checkpoint, then
    # the resumed run; in it every step once, no session and no task sample trained twice, and
    # everything the checkpoint had acknowledged trained.
    resumed = second.trained[len(first.trained) :]
    kept = [r for r in first.trained if r["step"] <= saved]
    assert {r["step"] for r in resumed} == set(range(saved + 1, steps + 1)), why
    assert _once(kept + resumed) == [], why
    assert acknowledged <= {r["session_id"] for r in resumed}, why
    assert identity_breaks(second.events) == [], why
