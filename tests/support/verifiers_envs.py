"""Three small environments written with verifiers' own classes (0.4.0, ``verifiers.v1``), for
the ``verifiers`` task set's tests: single-turn (``SingleAgentEnv`` over a taskset), multi-turn
(an ``Env`` that holds the rollout open with ``Interaction`` and speaks a second user turn), and
with a tool (a ``Toolset`` the task serves over MCP). One ``Taskset`` builds all three's rows.

Run as a module, this file is the tool server verifiers starts for each tool rollout (``python -m
support.verifiers_envs``), so it needs ``tests`` on ``PYTHONPATH``. A verifiers taskset id is a
top-level module name, so the module also answers as :data:`TASKSET_ID`.
"""

from __future__ import annotations

import sys
from typing import Literal

import verifiers.v1 as vf

TASKSET_ID = "areal_verifiers_demo"
sys.modules.setdefault(TASKSET_ID, sys.modules[__name__])

QUESTIONS = [("What is 2 plus 3?", "5"), ("What is 4 plus 4?", "8"), ("What is 1 plus 6?", "7")]
MAX_TOKENS = 8  # each model reply: the tests are about the plumbing, not the answers


class AddToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = None  # the model sees ``add``

    @vf.tool
    def add(self, a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)


class DemoTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()
    with_tool: bool = False


class DemoData(vf.TaskData):
    answer: str


class DemoTask(vf.Task[DemoData, vf.State, DemoTaskConfig]):
    @classmethod
    def toolsets(cls, config: DemoTaskConfig) -> list[vf.Toolset]:
        return [AddToolset(config.tools)] if config.with_tool else []

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        replies = trace.assistant_messages
        return 1.0 if replies and self.data.answer in (replies[-1].content or "") else 0.0

    @vf.reward(weight=0.5)
    async def brief(self, trace: vf.Trace) -> float:
        """Partial credit that varies with the reply, so a reward is rarely zero by chance."""
        return 1.0 / (1.0 + sum(len(m.content or "") for m in trace.assistant_messages))


class DemoConfig(vf.TasksetConfig):
    kind: Literal["single", "multi", "tool"] = "single"
    task: DemoTaskConfig = DemoTaskConfig()


class DemoTaskset(vf.Taskset[DemoTask, DemoConfig]):
    def load(self) -> list[DemoTask]:
        config = self.config.task.model_copy(update={"with_tool": self.config.kind == "tool"})
        return [
            DemoTask(DemoData(prompt=question, answer=answer), config)
            for question, answer in QUESTIONS
        ]


class FollowUpConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()


class FollowUpEnv(vf.Env[FollowUpConfig]):
    """Multi-turn: the row's question, the model's reply, then a second user turn and reply."""

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        async with agents.agent.interaction(task) as chat:
            await chat.turn()  # a prompted task speaks first: the opening reply
            await chat.turn("Answer with the number only.")


def _agent() -> vf.AgentConfig:
    """The chat loop verifiers bundles (``null``), on this machine, short replies."""
    return vf.AgentConfig(
        harness={"id": "null"},
        runtime=vf.SubprocessConfig(),
        sampling={"max_tokens": MAX_TOKENS},
        max_turns=4,
    )


def _taskset(kind: str) -> DemoConfig:
    return DemoConfig(id=TASKSET_ID, kind=kind)


def single_turn() -> vf.Env:
    return vf.SingleAgentEnv(vf.SingleAgentEnvConfig(taskset=_taskset("single"), agent=_agent()))


def multi_turn() -> vf.Env:
    return FollowUpEnv(FollowUpConfig(taskset=_taskset("multi"), agent=_agent()))


def with_tool() -> vf.Env:
    return vf.SingleAgentEnv(vf.SingleAgentEnvConfig(taskset=_taskset("tool"), agent=_agent()))


__all__ = ["DemoTaskset"]

if __name__ == "__main__":
    AddToolset.run()
