"""A math agent written against the plain ``openai`` SDK, as it would run against any OpenAI API.

It offers the model a calculator tool, runs the tool calls the model makes, and returns the final
text; areal's ``math_answer`` reward scores that text against the task's ``answer``. Nothing in
here knows about areal: the adapter hands ``solve`` a client bound to the episode's gateway
session, and ``max_turns`` from the run config.
"""

from __future__ import annotations

import ast
import json
import operator
from typing import Any

SYSTEM = (
    "Solve the arithmetic problem. Call the calculator tool for the arithmetic, then reply with "
    "the number only."
)
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression of integers with + - * and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


async def solve(task: dict[str, Any], client: Any, model: str, max_turns: int = 4) -> str:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": task["question"]},
    ]
    for _ in range(max_turns):
        reply = await client.chat.completions.create(
            model=model, messages=messages, tools=[CALCULATOR], max_tokens=48
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content or ""
        for call in message.tool_calls:
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": run_tool(call.function)}
            )
    return ""


def run_tool(function: Any) -> str:
    """The calculator; a bad call gets an error message back, as a real tool would send."""
    try:
        expression = json.loads(function.arguments)["expression"]
        return str(evaluate(ast.parse(str(expression), mode="eval").body))
    except (ValueError, KeyError, TypeError, SyntaxError, ZeroDivisionError) as err:
        return f"error: {err}"


def evaluate(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](evaluate(node.left), evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -evaluate(node.operand)
    raise ValueError("only integers, + - * and parentheses")
