"""Built-in task sets, registered through the same hook as a third-party plugin's."""

from __future__ import annotations

from areal.core.hookspecs import Register, hookimpl
from areal.core.tasks import TaskSet
from areal.plugins.tasks import (
    bfcl,
    calculator,
    reasoning_gym_tasks,
    tool_then_answer,
    verifiers_env,
)


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
    register(
        reasoning_gym_tasks.NAME,
        TaskSet(
            name=reasoning_gym_tasks.NAME,
            description=reasoning_gym_tasks.DESCRIPTION,
            task=reasoning_gym_tasks.task,
            agent=f"{reasoning_gym_tasks.__name__}:agent",
            success_reward=reasoning_gym_tasks.SUCCESS_REWARD,
            configure=reasoning_gym_tasks.configure,
        ),
    )
    register(verifiers_env.NAME, verifiers_env.TASK_SET)
    register(
        bfcl.NAME,
        TaskSet(
            name=bfcl.NAME,
            description=bfcl.DESCRIPTION,
            task=bfcl.task,
            agent=f"{bfcl.__name__}:agent",
            success_reward=bfcl.SUCCESS_REWARD,
            configure=bfcl.configure,
        ),
    )
