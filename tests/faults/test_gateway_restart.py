"""The gateway SIGKILLed in the middle of a real ``areal train`` run (quickstart, real processes):
the supervisor restarts it with the run's totals, so the run finishes, its episode books still
balance, nothing is trained twice, and the restart lets no burst of episodes through that would
go stale (AReaL's PR #1345: a gateway that forgot the run admitted (η + v + 1)·B at once)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.runs import BATCH, ROOT, SMALL, run_and_kill

STEPS, KILL_AT = 10, 4


@pytest.mark.slow
@pytest.mark.serial
def test_a_killed_gateway_comes_back_without_a_stale_burst(tmp_path: Path) -> None:
    run = run_and_kill(tmp_path / "out", steps=STEPS, kill_at=KILL_AT, timeout=240, overrides=SMALL)
    assert run.returncode == 0, "the run did not finish"
    assert run.killed_at_step >= KILL_AT, "the gateway was never killed"
    assert run.gateway_pythonpath == str(ROOT / "src")  # the child ran this checkout's areal
    assert run.last("end")["stopped_by"] == "max_steps"

    # The books balance on the last accounting event, the killed gateway's episodes included.
    acc = run.last("accounting")
    assert acc["restarts"] >= 1
    assert acc["episodes_sent"] == (
        acc["episodes_trained"]
        + acc["episodes_dropped"]
        + acc["episodes_discarded"]
        + acc["episodes_queued"]
        + acc["episodes_running"]
    ), acc
    assert acc["episodes_running"] >= 0, acc
    assert acc["episodes_discarded"] >= acc["episodes_lost"] >= 0

    # Nothing trained twice, across the restart; the audit trail and the books agree.
    ids = [r["session_id"] for r in run.trained]
    assert len(ids) == len(set(ids)) == acc["episodes_trained"]
    assert {r["step"] for r in run.trained} == set(range(1, STEPS + 1))

    # Stale drops after the restart stay within twice the rate before it, plus a quarter batch
    # of noise. The re-seeded budget admits (η + 1)·B ahead of the trainer, as before the kill;
    # the bug admitted v·B more at once (here >= 4 batches), which go stale once the trainer
    # is η + 1 steps past them: 6 steps after the kill leave time for that to show.
    before = run.stale_at(run.killed_at_step)
    after = run.stale_at(STEPS) - before
    steps_after = STEPS - run.killed_at_step
    rate = before / run.killed_at_step
    assert after <= 2 * rate * steps_after + BATCH // 4, (before, after, run.killed_at_step)
