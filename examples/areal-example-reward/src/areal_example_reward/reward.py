"""The ``concise_answer`` reward: the right answer, said briefly.

Agents trained on exact-match rewards learn to pad their answers with reasoning nobody reads. This
reward keeps exact-match's verdict but discounts long completions: a correct completion within the
word budget scores 1, one twice as long 0.5, and a wrong one always 0. It is a plain function of
the completion and the task, so it costs nothing per sample and needs no model.

Task keys: ``answer`` (the reference, required) and ``word_budget`` (optional, default 64).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

DEFAULT_WORD_BUDGET = 64

_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*", re.IGNORECASE)


def _normalize(text: str) -> str:
    """Case, inner whitespace and surrounding punctuation do not change an answer."""
    return re.sub(r"\s+", " ", text).strip().lower().strip(" .!?;:'\"`")


def final_line(completion: str) -> str:
    """What the completion commits to: its last non-empty line, after "answer is"/"answer:"."""
    lines = [line for line in completion.splitlines() if line.strip()]
    if not lines:
        return ""
    parts = _ANSWER_IS.split(lines[-1])
    return _normalize(parts[-1])


def is_correct(completion: str, answer: str) -> bool:
    """The final line is the answer, or ends with it as a whole word ("so it is 42")."""
    got, want = final_line(completion), _normalize(answer)
    if not want:
        return False
    return got == want or got.endswith(" " + want)


def concise_answer(*, completion: str, task: Mapping[str, Any]) -> float:
    """1 for a correct completion within ``task["word_budget"]`` words, ``budget / words`` for a
    longer correct one, 0 for a wrong one: always in [0, 1]."""
    if "answer" not in task:
        raise KeyError("the task has no 'answer' for the concise_answer reward")
    if not is_correct(completion, str(task["answer"])):
        return 0.0
    budget = int(task.get("word_budget", DEFAULT_WORD_BUDGET))
    if budget < 1:
        raise ValueError(f"word_budget must be at least 1, got {budget}")
    words = len(completion.split())
    return min(1.0, budget / words)
