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


def test_a_run_that_learned_and_then_lost_it_is_named_so() -> None:
    """Measured under load: success 0.91 by step 13, 0.02 at step 16, never back."""
    rates = [0.0, 0.0, 0.03, 0.16, 0.19, 0.48, 0.59, 0.57, 0.65, 0.57, 0.73, 0.73, 0.91, 0.86]
    rates += [0.73, 0.02, 0.22, 0.19, 0.01, 0.19, 0.12, 0.19, 0.12, 0.31, 0.06, 0.06, 0.09]
    rates += [0.06, 0.10, 0.25]
    history = [
        {**step(n, 8), "success": r, "behave_approx_kl": -0.74 if n == 15 else -0.05}
        for n, r in enumerate(rates, start=1)
    ]
    message = diagnose(history)
    assert message.startswith("success reached 83% around step 13, then fell to 2% at step 16")
    assert "0.74" in message and "learning_rate" in message
    rising = [{**step(n, 4), "success": n / 30} for n in range(1, 31)]
    assert not diagnose(rising).startswith("success reached")
