"""``bench/turn_credit.py`` reads a run's steps to the target as it says: the first step whose
success, averaged over the window ending there, reaches the target; a run that never reached it
counts as later than any that did; each arm is made of the overrides its description names."""

from __future__ import annotations

from support.cli import bench_script

turn_credit = bench_script("turn_credit")


def test_the_target_is_reached_by_the_windows_mean_not_one_lucky_step() -> None:
    success = [0.1, 0.5, 0.95, 0.7, 0.9, 0.92, 0.93, 0.2]
    assert turn_credit.steps_to_target(success, 0.9, 1) == 3
    assert turn_credit.steps_to_target(success, 0.9, 3) == 7  # (0.9 + 0.92 + 0.93) / 3
    assert turn_credit.steps_to_target(success[:6], 0.9, 3) is None
    assert turn_credit.steps_to_target([0.95, 0.95], 0.9, 3) is None  # no full window yet


def test_a_run_record_reads_steps_and_seconds_from_the_metrics() -> None:
    records = [
        {"event": "run", "step": 0, "time": 100.0},
        *(
            {"event": "train", "step": s, "time": 100.0 + 2 * s, "success": v}
            for s, v in enumerate([0.2, 0.9, 0.95, 0.91], start=1)
        ),
        {"event": "sync", "step": 4, "time": 109.0},
    ]
    record = turn_credit.run_record(records, 0.9, 2)
    assert (record["steps"], record["steps_to_target"], record["seconds_to_target"]) == (4, 3, 6.0)
    assert (record["final_success"], record["train_seconds"]) == (0.93, 8.0)


def test_a_run_that_never_reached_the_target_is_later_than_any_that_did() -> None:
    assert turn_credit.median_steps([12, None, 20]) == 20
    assert turn_credit.median_steps([12, None, None]) is None  # the median is past max steps
    assert turn_credit.median_steps([10, 20]) == 15
    summary = turn_credit.arm_summary(
        [
            {
                "steps_to_target": s,
                "seconds_to_target": None,
                "final_success": 0.9,
                "train_seconds": 50.0,
                "wall_seconds": 90.0,
                "seed": i,
            }
            for i, s in enumerate([14, None, 18])
        ],
        40,
    )
    assert (summary["range"], summary["not_reached"], summary["median"]) == ([14, 18], 1, 18)


def test_the_arms_differ_in_the_key_reward_and_the_estimator_only() -> None:
    arms = turn_credit.arms(0.5)
    assert arms["outcome"].overrides == ()
    assert set(arms["turn"].overrides) == {
        "dataset.options.key_reward=0.5",
        "dataset.options.key_reward_to=turn",
        "algorithm.advantage=turn",
        "algorithm.advantage_options.normalize_std=true",
    }
    assert set(arms["episode"].overrides) == {
        "dataset.options.key_reward=0.5",
        "dataset.options.key_reward_to=episode",
    }
