"""``make demo``'s own logic: where it writes, and what it says when the reward does not rise."""

from __future__ import annotations

from pathlib import Path

from areal.demo import demo_config, diagnose

QUICKSTART = str(Path(__file__).parents[1] / "configs" / "quickstart.yaml")


def test_everything_goes_under_the_output_dir(tmp_path: Path) -> None:
    config = demo_config(QUICKSTART, tmp_path / "x", [])
    assert config.model.path == str(tmp_path / "x" / "model")
    assert config.logging.log_dir == str(tmp_path / "x" / "logs")
    mine = demo_config(QUICKSTART, tmp_path / "x", [f"logging.log_dir={tmp_path / 'mine'}"])
    assert mine.logging.log_dir == str(tmp_path / "mine")  # the user's --set wins


def step(n: int, flat: int, groups: int = 16, reward: float = 0.4) -> dict[str, float]:
    return {"step": n, "flat_groups": flat, "groups": groups, "reward": reward}


def test_a_run_whose_groups_all_went_flat_is_named_so() -> None:
    history = [step(1, 2), step(2, 16), step(3, 4), *(step(n, 16) for n in range(4, 31))]
    message = diagnose(history)
    assert message.startswith("from step 4 on every group had equal rewards (0.40)")
    assert "algorithm.group_size=16" in message


def test_mostly_flat_groups_and_a_slow_rise_are_told_apart() -> None:
    assert diagnose([step(n, 12) for n in range(1, 11)]).startswith("75% of the groups")
    assert "train.max_steps" in diagnose([step(n, 1) for n in range(1, 11)])


def test_first_and_last_fifth_of_the_steps() -> None:
    from areal.demo import first_and_last

    assert first_and_last([0.0] * 6 + [0.5] * 18 + [1.0] * 6) == (0.0, 1.0)
    assert first_and_last([0.2, 0.8]) == (0.2, 0.8)  # at least one step each
