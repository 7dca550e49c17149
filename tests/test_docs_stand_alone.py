"""The repository stands alone: no doc, docstring or comment points at a file outside it.

The design brief, wire-format notes and measurements that shaped the project live outside the
repository; what a reader needs of them is written into ``docs/``. This test fails on any mention
of those outside files, or of a path that leaves the repository (``../shared``)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = re.compile(r"\b(DESIGN|MEASURED|SGLANG_API|STYLE)\.md\b|\.\./shared\b")
SCANNED = ("README.md", "docs", "src", "tests", "bench", "examples", "configs", "Makefile")
SUFFIXES = {".md", ".py", ".yaml", ".yml", ".toml", ".sh", ".txt", ""}


def _files() -> list[Path]:
    found: list[Path] = []
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found.extend(
                p
                for p in path.rglob("*")
                if p.is_file() and p.suffix in SUFFIXES and "egg-info" not in str(p)
            )
    return found


def test_nothing_points_outside_the_repository() -> None:
    me = Path(__file__).resolve()
    hits = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}"
        for path in _files()
        if path.resolve() != me
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not hits, "\n".join(hits)
