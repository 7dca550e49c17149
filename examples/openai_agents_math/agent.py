"""A math agent written with the OpenAI Agents SDK (``openai-agents``), as it would run against
OpenAI: an ``Agent`` with a calculator tool, which the SDK's ``Runner`` runs on each question.

Nothing in here knows about areal. The run config names ``agent`` with ``framework:
openai_agents``: the adapter runs it on the task's question in the episode's gateway session, over
the Responses API (the SDK's default; ``api="chat_completions"`` for the other), and areal's
``math_answer`` reward scores its final output against the task's ``answer``.

Tracing: the Agents SDK can export a trace of every run (each model call, tool call and handoff),
to OpenAI's traces dashboard by default, or to any OpenTelemetry backend through a processor of
your own. Under areal tracing stays off, so nothing leaves the machine, unless you turn it on:
wrap the agent with ``tracing=True`` and make that the entrypoint, e.g. add here

    import areal
    from agents import set_trace_processors

    set_trace_processors([MyOpenTelemetryProcessor()])  # or keep the SDK's exporter to OpenAI,
    traced = areal.wrap(agent, framework="openai_agents", tracing=True)  # with OPENAI_API_KEY set

and set ``agent.entrypoint: examples.openai_agents_math.agent:traced`` in config.yaml.
"""

from __future__ import annotations

import operator
from typing import Literal

from agents import Agent, function_tool

OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


@function_tool
def calculator(a: int, op: Literal["+", "-", "*"], b: int) -> int:
    """Compute ``a op b`` for two integers."""
    return OPERATORS[op](a, b)


agent = Agent(
    name="math",
    instructions=(
        "Solve the arithmetic problem. Call the calculator tool for the arithmetic, then reply "
        "with the number only."
    ),
    tools=[calculator],
)
