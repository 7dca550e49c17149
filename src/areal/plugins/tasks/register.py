"""Built-in task sets, registered through the same hook as a third-party plugin's."""

from __future__ import annotations

from types import ModuleType

from areal.core.hookspecs import Register, hookimpl
from areal.core.tasks import TaskSet
from areal.plugins.tasks import (
    bfcl,
    calculator,
    reasoning_gym_tasks,
    tool_then_answer,
    verifiers_env,
)


def built_in(module: ModuleType) -> TaskSet:
    """A task-set module's parts as its :class:`TaskSet`: ``NAME``, ``DESCRIPTION``, ``task``,
    ``agent``, ``SUCCESS_REWARD``, and where it has them, ``demonstration`` and ``configure``."""
    return TaskSet(
        name=module.NAME,
        description=module.DESCRIPTION,
        task=module.task,
        agent=f"{module.__name__}:agent",
        demonstration=getattr(module, "demonstration", None),
        success_reward=module.SUCCESS_REWARD,
        configure=getattr(module, "configure", None),
    )


@hookimpl
def areal_register_task_sets(register: Register) -> None:
    for module in (tool_then_answer, calculator, reasoning_gym_tasks, bfcl):
        register(module.NAME, built_in(module))
    register(verifiers_env.NAME, verifiers_env.TASK_SET)
