"""``python -m areal``: the same command as ``areal``."""

from __future__ import annotations

from areal.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
