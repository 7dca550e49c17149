"""Rule and verifier rewards: no model involved, the same answer always scores the same.

The reference answer is ``task["answer"]``. ``exact_match`` compares normalised text;
``math_answer`` reads the final answer the way graders of math datasets do (a ``\\boxed{...}``, else
the text after "answer:", else the last number) and compares numerically when both sides are numbers.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_ANSWER_LINE = re.compile(r"answer\s*(?:is|:)\s*(.+)", re.IGNORECASE)


def _reference(task: Mapping[str, Any]) -> str:
    if "answer" not in task:
        raise KeyError("the task has no 'answer' for a rule reward")
    return str(task["answer"])


def normalize_text(text: str) -> str:
    """Case, accents' composition, surrounding punctuation and inner whitespace do not matter."""
    text = unicodedata.normalize("NFKC", text).strip().lower()
    text = re.sub(r"\s+", " ", text)
    return text.strip(" .!?;:'\"`")


def exact_match(*, completion: str, task: Mapping[str, Any]) -> float:
    return 1.0 if normalize_text(completion) == normalize_text(_reference(task)) else 0.0


def _boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def final_answer(text: str) -> str:
    """The answer a solution commits to: boxed, else after "answer:", else its last number."""
    boxed = _boxed(text)
    if boxed is not None:
        return boxed.strip()
    lines = _ANSWER_LINE.findall(text)
    if lines:
        return lines[-1].strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else text.strip()


def as_number(text: str) -> Fraction | None:
    text = text.strip().rstrip(".").replace(",", "").replace("$", "")
    match = _NUMBER.fullmatch(text)
    if match is None:
        return None
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def math_answer(*, completion: str, task: Mapping[str, Any]) -> float:
    reference = _reference(task)
    got, want = final_answer(completion), (_boxed(reference) or reference).strip()
    got_n, want_n = as_number(got), as_number(want)
    if got_n is not None and want_n is not None:
        return 1.0 if got_n == want_n else 0.0
    return 1.0 if normalize_text(got) == normalize_text(want) else 0.0
