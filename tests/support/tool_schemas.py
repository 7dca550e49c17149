"""Tool argument schemas an untrained policy fills within a few tokens (a bounded integer, an enum,
a boolean), so a forced call closes well within any test's ``max_tokens``."""

from __future__ import annotations

from typing import Any

ARGS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
        "op": {"type": "string", "enum": ["add", "sub"]},
        "go": {"type": "boolean"},
    },
    "required": ["n", "op", "go"],
    "additionalProperties": False,
}
FLIP: dict[str, Any] = {
    "type": "object",
    "properties": {"heads": {"type": "boolean"}},
    "required": ["heads"],
    "additionalProperties": False,
}
