"""A math agent written with DSPy, as it would run against any model: a ``ReActV2`` program with a
calculator tool, on native function calling (``dspy.JSONAdapter``).

The ``dspy`` adapter runs ``solve`` in each episode inside ``dspy.context(lm=...)``, the LM bound to
the episode's gateway session (no cache, no retries: each call is a turn the trainer sees), so the
program names no LM of its own. The answer is scored by areal's ``math_answer`` reward against the
task's ``answer``. Nothing in here knows about areal, and nothing leaves 127.0.0.1: the adapter
keeps DSPy and LiteLLM on their bundled model-price map instead of GitHub's.
"""

from __future__ import annotations

import ast
import operator
from typing import Any

import dspy
from dspy.utils.exceptions import AdapterParseError

OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


class Solve(dspy.Signature):
    """Solve the arithmetic problem; use the calculator for the arithmetic."""

    question: str = dspy.InputField()
    answer: int = dspy.OutputField()


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression of integers with + - * and parentheses."""
    try:
        return str(evaluate(ast.parse(expression, mode="eval").body))
    except (ValueError, TypeError, SyntaxError) as err:  # a bad call: say so, as a real tool would
        return f"error: {err}"


def evaluate(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](evaluate(node.left), evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -evaluate(node.operand)
    raise ValueError("only integers, + - * and parentheses")


async def solve(task: dict[str, Any], lm: Any, max_turns: int = 4) -> str:
    # The last turn is ReActV2's forced call of its `submit` tool with the typed answer.
    program = dspy.ReActV2(Solve, tools=[calculator], max_iters=max_turns - 1)
    try:
        with dspy.context(adapter=dspy.JSONAdapter()):
            prediction = await program.acall(question=task["question"])
    except (AdapterParseError, ValueError):  # no well-formed answer in time: scored as wrong
        return ""
    return str(prediction.answer)
