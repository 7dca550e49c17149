"""A LangChain tool agent: a ``ChatOpenAI`` with one tool bound, the usual tool loop.

The adapter hands ``run`` a ``ChatOpenAI`` bound to the episode's gateway session (any agent
built on langchain-core's chat models works the same way). The final text is scored by areal's
``math_answer`` reward against the task's ``answer``.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool


@tool
def square(n: int) -> int:
    """The square of an integer n."""
    return n * n


async def run(task: dict[str, Any], llm: Any, max_turns: int = 4) -> str:
    model = llm.bind_tools([square]).bind(max_tokens=48)
    messages: list[Any] = [
        SystemMessage("Answer with the number only. Use the square tool."),
        HumanMessage(task["question"]),
    ]
    for _ in range(max_turns):
        reply = await model.ainvoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            return str(reply.content)
        for call in reply.tool_calls:
            try:
                result = str(square.invoke(call["args"]))
            except Exception as err:  # a malformed call: tell the model, as a real tool would
                result = f"error: {err}"
            messages.append(ToolMessage(result, tool_call_id=call["id"]))
    return ""
