"""areal-example-reward: a complete third-party areal plugin, small enough to read in one sitting.

The hook implementations live in :mod:`areal_example_reward.plugin` (the entry point); the reward,
the command and the panel each have their own module so each can be tested alone.
"""

from __future__ import annotations

__version__ = "0.1.0"
