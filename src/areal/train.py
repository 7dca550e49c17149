"""The seed article's entry point, kept as written:
``python -m areal.train --config configs/agent_async_train.yaml --agent-config agent_config.py
--output-dir ./checkpoints/run_001`` (the same run as ``areal train``; see :mod:`areal.run.train`)."""

from __future__ import annotations

import sys

from areal.run.train import main

if __name__ == "__main__":
    sys.exit(main())
