"""Built-in task sets, registered through the same hook as a third-party plugin's."""

from __future__ import annotations

from areal.core.hookspecs import Register, hookimpl
from areal.core.tasks import TaskSet
from areal.plugins.tasks import calculator, tool_then_answer


@hookimpl
def areal_register_task_sets(register: Register) -> None:
    register(
        tool_then_answer.NAME,
        TaskSet(
            name=tool_then_answer.NAME,
            description=tool_then_answer.DESCRIPTION,
            task=tool_then_answer.task,
            agent="areal.plugins.tasks.tool_then_answer:agent",
            demonstration=tool_then_answer.demonstration,
        ),
    )
    register(
        calculator.NAME,
        TaskSet(
            name=calculator.NAME,
            description=calculator.DESCRIPTION,
            task=calculator.task,
            agent="areal.plugins.tasks.calculator:agent",
            demonstration=calculator.demonstration,
        ),
    )
