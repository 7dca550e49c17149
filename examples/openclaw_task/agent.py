"""OpenClaw fixing the same bug, rewarded by the task's test.

One ``openclaw agent exec`` turn per episode with a throw-away config whose only provider is the
gateway; ``lean`` mode and the ``coding`` tool profile keep the prompt small. OpenClaw spends
10-40 s starting up per run, so keep batches small on CPU. For an install that keeps one fixed
key, add ``fixed_key_env="OPENCLAW_API_KEY"`` (episodes then run one at a time per key).
"""

from __future__ import annotations

import sys

import areal

agent = areal.wrap(
    "openclaw",
    tools_profile="coding",
    context_window=8192,
    max_tokens=256,
    reward_command=[sys.executable, "test_calc.py"],
    reward_timeout_s=30.0,
    timeout_s=300.0,
)
