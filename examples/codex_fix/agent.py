"""Codex fixing a bug, rewarded by the task's own test.

Each episode copies the task's ``files`` into a fresh workspace, runs ``codex exec <prompt>``
headless against the gateway's Responses API (the policy is Codex's only model), then runs
``python test_calc.py`` there: exit 0 is reward 1.0, anything else 0.0.

Codex's default prompt (instructions, skills and nine tools: ~11.4k tokens) is far beyond the
tiny model's 4096-token context. Short instructions, and Codex's goals, sub-agents, skills and web
search turned off, bring it to ~2.5k tokens with its shell tools kept. With a long-context policy,
run Codex as it ships: ``areal.wrap("codex", reward_command=...)``.
"""

from __future__ import annotations

import sys

import areal

INSTRUCTIONS = (
    "You are Codex, a coding agent in a terminal. Use exec_command to read and edit the files "
    "of the workspace and to run the task's test. Stop when the test passes; reply briefly."
)

agent = areal.wrap(
    "codex",
    instructions=INSTRUCTIONS,
    config={
        "web_search": "disabled",
        "features": {"goals": False, "multi_agent": False},
        "skills": {"include_instructions": False, "bundled": {"enabled": False}},
    },
    reward_command=[sys.executable, "test_calc.py"],
    reward_timeout_s=30.0,
    timeout_s=240.0,
)
