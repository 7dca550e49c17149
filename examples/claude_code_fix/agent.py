"""Claude Code fixing a bug, rewarded by the task's own test.

Each episode copies the task's ``files`` into a fresh workspace, runs ``claude -p <prompt>``
headless against the gateway (the policy serves every model slot), then runs
``python test_calc.py`` there: exit 0 is reward 1.0, anything else 0.0. ``--bare`` and a small
tool set keep the prompt near 1k tokens, which a small policy's context can hold; Claude Code's
default prompt (~12k+ tokens) needs a policy with a long context.
"""

from __future__ import annotations

import sys

import areal

agent = areal.wrap(
    "claude_code",
    tools=["Read", "Edit"],
    allowed_tools=["Read", "Edit"],
    max_output_tokens=256,
    reward_command=[sys.executable, "test_calc.py"],
    reward_timeout_s=30.0,
    timeout_s=240.0,
)
