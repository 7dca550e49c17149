"""Rule rewards against hand-written cases."""

from __future__ import annotations

import pytest

from areal.core.plugins import make_plugin_manager, registry
from areal.plugins.rewards.rules import exact_match, final_answer, math_answer


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("Paris", "paris", 1.0),
        ("  Paris. ", "Paris", 1.0),
        ("The  capital\nis Paris", "the capital is paris", 1.0),
        ("Lyon", "Paris", 0.0),
        ("Ｐａｒｉｓ", "Paris", 1.0),  # full-width letters fold with NFKC
    ],
)
def test_exact_match(completion: str, answer: str, expected: float) -> None:
    assert exact_match(completion=completion, task={"answer": answer}) == expected


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("so x = 3 and the total is \\boxed{42}", "42", 1.0),
        ("\\boxed{\\frac{1}{2}} is it", "\\frac{1}{2}", 1.0),
        ("We get 1,000 apples.", "1000", 1.0),
        ("The answer is 0.5", "1/2", 1.0),
        ("Answer: 7.", "7", 1.0),
        ("first 12, then 13", "12", 0.0),  # the last number counts
        ("no number here", "5", 0.0),
        ("\\boxed{x+1}", "x + 1", 0.0),  # not numbers: normalised text must match exactly
        ("\\boxed{x + 1}", "x + 1", 1.0),
    ],
)
def test_math_answer(completion: str, answer: str, expected: float) -> None:
    assert math_answer(completion=completion, task={"answer": answer}) == expected


def test_final_answer_prefers_boxed_then_answer_line() -> None:
    assert final_answer("3 then \\boxed{\\sqrt{2}} then 9") == "\\sqrt{2}"
    assert final_answer("steps 1 2 3. The answer is 12 apples") == "12 apples"


def test_missing_reference_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match="no 'answer'"):
        math_answer(completion="1", task={})


def test_registered_through_the_hook() -> None:
    rewards = registry("rewards", make_plugin_manager(load_entry_points=False))
    assert rewards.get("math_answer")(completion="\\boxed{4}", task={"answer": 4}) == 1.0
    assert {"exact_match", "math_answer"} <= set(rewards.names())
