"""A math agent written against LiteLLM, as it would run against any provider LiteLLM routes to.

It offers the model a calculator tool through ``litellm.acompletion``, runs the calls the model
makes, and returns the final text; areal's ``math_answer`` reward scores that text against the
task's ``answer``. The adapter hands ``solve`` its episode's endpoint in LiteLLM's terms
(``client.params``: ``model="openai/<policy>"``, ``api_base``, ``api_key``), and ``max_turns``
from the run config. Wrapped with ``protocol="anthropic"``
(``areal.wrap(solve, framework="litellm", protocol="anthropic")``), the same code goes through the
gateway's Anthropic route instead: LiteLLM translates.
"""

from __future__ import annotations

import ast
import json
import operator
import os
from typing import Any

# LiteLLM's own switch: use the model-price map it bundles instead of downloading one from GitHub
# when it is imported (which happens before areal's adapter can set it).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm

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


async def solve(task: dict[str, Any], client: Any, max_turns: int = 4) -> str:
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": task["question"]},
    ]
    for _ in range(max_turns):
        reply = await litellm.acompletion(
            **client.params, messages=messages, tools=[CALCULATOR], max_tokens=48
        )
        message = reply.choices[0].message
        messages.append(message)
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
