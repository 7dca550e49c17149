"""AReaL's admission rule and the version clock, against hand-computed counts."""

from __future__ import annotations

import threading

import pytest

from areal.core.staleness import UNREADABLE, StalenessBudget, staleness


def test_staleness_is_trainer_version_minus_the_oldest_token() -> None:
    assert staleness(5, [3, 4, 5]) == 2
    assert staleness(5, [5, 5]) == 0
    assert staleness(5, []) == 0  # no generated token


@pytest.mark.parametrize(
    "versions",
    [
        [-1],  # SGLang's and vLLM's start-up label "default" (or none): no version number
        [-1, 4, -1],  # one unreadable token is enough: the sample mixes unknown weights in
        [4, 6],  # newer than the trainer: another run's label, not a version of this run
        [6],
    ],
)
def test_a_token_without_a_run_version_is_staler_than_any_bound(versions: list[int]) -> None:
    assert staleness(5, versions) == UNREADABLE
    assert all(staleness(5, versions) > bound for bound in (0, 1, 8, 10**6))
    assert staleness(0, versions) == UNREADABLE  # also at the run's first version


def test_version_rule_admits_staleness_plus_one_batches() -> None:
    # (threshold 1 + version 0 + 1) * batch 4 = 8 episodes before the trainer moves.
    budget = StalenessBudget(trigger_batch_size=4, staleness_threshold=1)
    assert budget.capacity() == 8
    assert all(budget.try_start() for _ in range(8))
    assert not budget.try_start() and budget.capacity() == 0
    for _ in range(3):
        budget.finish(accepted=True)
    # accepted 3 + running 5 = 8: accepting frees nothing until the version moves.
    assert budget.capacity() == 0 and (budget.accepted, budget.running) == (3, 5)
    budget.set_version(1)  # (1 + 1 + 1) * 4 = 12 > 8
    assert budget.capacity() == 4
    budget.set_version(0)  # the clock never moves back
    assert budget.version == 1 and budget.capacity() == 4


def test_rejected_episodes_give_their_slot_back() -> None:
    budget = StalenessBudget(trigger_batch_size=2, staleness_threshold=0)
    assert budget.try_start() and budget.try_start() and not budget.try_start()
    budget.finish(accepted=False)  # accepted 0 + running 1 < 2
    snap = budget.snapshot()
    assert (snap.accepted, snap.running, snap.rejected, snap.capacity) == (0, 1, 1, 1)
    assert snap.to_json()["capacity"] == 1


def test_concurrency_cap_and_the_tighter_limit_wins() -> None:
    capped = StalenessBudget(max_concurrent=2)
    assert capped.try_start() and capped.try_start() and not capped.try_start()
    capped.finish(accepted=True)
    assert capped.capacity() == 1  # no version rule: only the cap counts
    both = StalenessBudget(trigger_batch_size=8, staleness_threshold=0, max_concurrent=3)
    assert both.capacity() == 3  # min(8 - 0, 3 - 0)
    for _ in range(3):
        both.try_start()
        both.finish(accepted=True)
    assert both.capacity() == 3  # min(8 - 3, 3)
    for _ in range(3):
        both.try_start()
        both.finish(accepted=True)
    assert both.capacity() == 2  # min(8 - 6, 3)


def test_unbounded_by_default() -> None:
    budget = StalenessBudget()
    assert budget.capacity() is None
    assert all(budget.try_start() for _ in range(1000))
    assert budget.snapshot().capacity is None


def test_threads_never_overshoot() -> None:
    budget = StalenessBudget(trigger_batch_size=10, staleness_threshold=2)  # room for 30
    admitted: list[int] = []

    def worker() -> None:
        admitted.extend(1 for _ in range(20) if budget.try_start())

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(admitted) == 30 and budget.running == 30


def test_bad_settings_and_misuse_are_refused() -> None:
    with pytest.raises(ValueError, match="trigger_batch_size"):
        StalenessBudget(trigger_batch_size=0)
    with pytest.raises(ValueError, match="staleness_threshold"):
        StalenessBudget(staleness_threshold=-1)
    with pytest.raises(ValueError, match="max_concurrent"):
        StalenessBudget(max_concurrent=0)
    with pytest.raises(RuntimeError, match="without a running episode"):
        StalenessBudget().finish(accepted=True)


def test_episodes_dropped_as_stale_give_their_slots_back() -> None:
    budget = StalenessBudget(trigger_batch_size=2, staleness_threshold=0)
    assert budget.try_start() and budget.try_start() and not budget.try_start()
    budget.finish(accepted=True)
    budget.finish(accepted=True)
    assert budget.capacity() == 0  # (0 + 0 + 1) × 2 = 2 accepted: full until the version moves
    # The trainer dropped one of them as stale (a running total): one slot comes back, once.
    assert budget.release_dropped(1) == 1 and budget.capacity() == 1
    assert budget.release_dropped(1) == 0 and budget.capacity() == 1
    assert budget.release_dropped(3) == 1  # accepted cannot go below zero
    assert budget.snapshot().accepted == 0


# --- the counters are the run's: re-seeded after a resume or a gateway restart -----------------
# All with staleness_threshold 1 and trigger_batch_size 4: (1 + v + 1) × 4 episodes by version v.


def test_fresh_start_admits_two_batches_and_a_zero_announce_changes_nothing() -> None:
    budget = StalenessBudget(trigger_batch_size=4, staleness_threshold=1)
    assert budget.capacity() == 8  # (1 + 0 + 1) × 4 − 0
    budget.reseed(consumed=0, dropped=0)
    assert budget.capacity() == 8
    snap = budget.snapshot().to_json()
    assert (snap["accepted_total"], snap["released"], snap["accepted"]) == (0, 0, 0)


def test_resume_at_version_v_with_consumed_c_admits_the_look_ahead_only() -> None:
    # A run resumed at version 5 had received 22 episodes and dropped 2 of them: 20 count.
    # (1 + 5 + 1) × 4 = 28 allowed, 28 − 20 = 8 = (threshold + 1) batches, not 28.
    seeded = StalenessBudget(
        trigger_batch_size=4, staleness_threshold=1, version=5, consumed=22, dropped=2
    )
    assert seeded.capacity() == 8
    announced = StalenessBudget(trigger_batch_size=4, staleness_threshold=1, version=5)
    assert announced.capacity() == 28  # the bug: a gateway that forgot the run
    announced.reseed(consumed=22, dropped=2)
    assert announced.capacity() == 8 and announced.accepted == 20


def test_gateway_restart_mid_run_continues_from_the_trainers_totals() -> None:
    # The old gateway died at version 3; the trainer had received 15 episodes, dropped 1.
    budget = StalenessBudget(trigger_batch_size=4, staleness_threshold=1, version=3)
    budget.reseed(consumed=15, dropped=1)
    assert budget.capacity() == 6  # (1 + 3 + 1) × 4 = 20 − (15 − 1)
    for _ in range(2):  # two episodes of the new gateway reach the trainer
        assert budget.try_start()
        budget.finish(accepted=True)
    assert budget.capacity() == 4  # 20 − 16
    # The next announce counts those two in consumed (17): nothing is counted twice.
    budget.reseed(consumed=17, dropped=1)
    assert budget.capacity() == 4 and budget.snapshot().accepted_total == 17
    # A straggler of the old gateway reached the trainer after the restart: consumed 18 > 17.
    budget.reseed(consumed=18, dropped=1)
    assert budget.capacity() == 3


def test_repeated_and_older_announces_are_counted_once() -> None:
    budget = StalenessBudget(trigger_batch_size=4, staleness_threshold=1, version=2)
    budget.reseed(consumed=10, dropped=2)
    assert budget.capacity() == 8  # (1 + 2 + 1) × 4 = 16 − (10 − 2)
    budget.reseed(consumed=10, dropped=2)
    assert budget.capacity() == 8
    budget.reseed(consumed=8, dropped=1)  # an older announce: totals never move back
    assert budget.capacity() == 8
    assert budget.release_dropped(2) == 0  # the same dropped total through the old route
    assert budget.release_dropped(3) == 1 and budget.capacity() == 9


def test_an_episode_being_handed_over_is_not_counted_twice() -> None:
    budget = StalenessBudget(trigger_batch_size=4, staleness_threshold=1)
    assert budget.try_start()  # its trajectory is on its way: the trainer has it, finish not yet
    budget.reseed(consumed=1, dropped=0, pending=1)
    assert budget.snapshot().accepted_total == 0
    budget.finish(accepted=True)
    snap = budget.snapshot()
    assert (snap.accepted_total, snap.running, snap.capacity) == (1, 0, 7)  # 8 − 1
