"""Built-in task sets, registered through the same hook as a third-party plugin's."""

from __future__ import annotations

from areal.core.hookspecs import Register, hookimpl
from areal.core.tasks import TaskSet
from areal.plugins.tasks import calculator, tool_then_answer


@hookimpl
def areal_register_task_sets(register: Register) -> None:
    for module in (tool_then_answer, calculator):
        register(
            module.NAME,
            TaskSet(
                name=module.NAME,
                description=module.DESCRIPTION,
                task=module.task,
                agent=f"{module.__name__}:agent",
                demonstration=module.demonstration,
                success_reward=module.SUCCESS_REWARD,
            ),
        )
