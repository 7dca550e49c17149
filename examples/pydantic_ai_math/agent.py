"""A math agent written with Pydantic AI, as it would run against any model: an ``Agent`` with a
calculator tool, no model of its own.

The ``pydantic_ai`` adapter runs ``agent`` in each episode on a model bound to the episode's
gateway session (``agent.run(question, model=...)``, Chat Completions by default), at most
``max_turns`` model requests; its text output is the answer, which areal's ``math_answer`` reward
scores against the task's ``answer``. Nothing in here knows about areal.

Telemetry: Pydantic AI can export OpenTelemetry traces of every run (to Logfire with
``logfire.configure(); logfire.instrument_pydantic_ai()``, or to any OTel backend with
``Agent.instrument_all()`` or ``capabilities=[Instrumentation()]``). It stays off unless you turn
it on here, and the adapter keeps the Anthropic SDK's own tracing off too: a training run sends
nothing anywhere but the gateway on 127.0.0.1.
"""

from __future__ import annotations

import ast
import operator

from pydantic_ai import Agent

OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


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


agent = Agent(
    instructions=(
        "Solve the arithmetic problem. Call the calculator tool for the arithmetic, then reply "
        "with the number only."
    ),
    tools=[calculator],
    model_settings={"max_tokens": 48},
)
