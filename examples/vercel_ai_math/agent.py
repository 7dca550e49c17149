"""The Vercel AI SDK math agent (``agent.mjs``), run with Node once per episode.

The adapter runs ``node agent.mjs`` in a fresh directory with the episode's gateway URL and key in
``OPENAI_BASE_URL``/``OPENAI_API_KEY`` (and ``ANTHROPIC_*``), the policy's model id in
``AREAL_MODEL`` and the task's question in ``AREAL_PROMPT``; the script's ``{"answer": ...}`` line
is scored by the run's ``math_answer`` reward. ``make setup`` installs the AI SDK under
``.cache/aisdk`` and Node 24 under ``.cache/openclaw``, where the adapter finds them; elsewhere,
``npm install ai @ai-sdk/openai zod`` next to the script and name a Node >= 22 with ``node=``.
"""

from __future__ import annotations

from pathlib import Path

import areal

agent = areal.wrap(str(Path(__file__).with_name("agent.mjs")), framework="vercel_ai", timeout_s=120)
