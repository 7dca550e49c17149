"""Built-in task sets: tasks, the agent that plays them, and format demonstrations for a warm start.

:mod:`.tool_then_answer` is the task ``make demo`` trains on; :mod:`.register` puts it in the
``task_sets`` registry.
"""
