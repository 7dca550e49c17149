"""areal: fully asynchronous RL for LLM agents. Importing this package never imports torch."""

from __future__ import annotations

__version__ = "0.1.0"

from areal.core.hookspecs import hookimpl

__all__ = ["__version__", "hookimpl"]
